//! The HTTP filter part of the ABI (`envoy.filters.http.dynamic_modules`): the
//! `outbound` filter. 1.40 resolves all twenty hooks below when a filter config is
//! created (a missing one fails it), so the ones this filter does not use are empty.
//! Config hooks run on the main thread; a stream's hooks on its worker.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

use themis_core::PeerId;

use super::{log, EnvoyBuffer, ModuleBuffer};
use crate::metrics;
use crate::outbound::Outbound;
use themis_sidecar::config::Transport;
use themis_sidecar::outbound::{counter_names, Refusal, CARRY_HEADER};
use themis_sidecar::reason::Rejection;

use super::guard::hook;

type ConfigPtr = *mut c_void;
type StreamPtr = *mut c_void;

/// `envoy_dynamic_module_type_http_header_type`.
const REQUEST_HEADERS: u32 = 0;
const RESPONSE_HEADERS: u32 = 2;
/// `..._headers_status` (Envoy's `FilterHeadersStatus`).
const HEADERS_CONTINUE: u32 = 0;
const HEADERS_STOP: u32 = 1;
/// `envoy_dynamic_module_type_attribute_id_RequestProtocol` (`HTTP/1.1`, `HTTP/2`, ...).
const ATTRIBUTE_REQUEST_PROTOCOL: u32 = 10;
/// `envoy_dynamic_module_type_attribute_id_ResponseFlags`.
const ATTRIBUTE_RESPONSE_FLAGS: u32 = 17;
/// `envoy_dynamic_module_type_metrics_result_Success`.
const METRICS_SUCCESS: u32 = 0;

#[repr(C)]
struct HttpHeader {
    key: *const u8,
    key_length: usize,
    value: *const u8,
    value_length: usize,
}

impl HttpHeader {
    fn of(key: &str, value: &str) -> Self {
        HttpHeader {
            key: key.as_ptr(),
            key_length: key.len(),
            value: value.as_ptr(),
            value_length: value.len(),
        }
    }
}

extern "C" {
    fn envoy_dynamic_module_callback_http_get_header(
        f: StreamPtr,
        header_type: u32,
        key: ModuleBuffer,
        result: *mut EnvoyBuffer,
        index: usize,
        count: *mut usize,
    ) -> bool;
    /// A null value removes the header.
    fn envoy_dynamic_module_callback_http_set_header(
        f: StreamPtr,
        header_type: u32,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_send_response(
        f: StreamPtr,
        status: u32,
        headers: *const HttpHeader,
        headers_length: usize,
        body: ModuleBuffer,
        details: ModuleBuffer,
    );
    fn envoy_dynamic_module_callback_http_filter_get_attribute_int(
        f: StreamPtr,
        attribute: u32,
        result: *mut u64,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_filter_get_attribute_string(
        f: StreamPtr,
        attribute: u32,
        result: *mut EnvoyBuffer,
    ) -> bool;
    /// Routes the request again, from its headers as they are now.
    fn envoy_dynamic_module_callback_http_clear_route_cache(f: StreamPtr);
    /// 0 when the stream has no upstream connection.
    fn envoy_dynamic_module_callback_http_get_upstream_connection_id(f: StreamPtr) -> u64;
    fn envoy_dynamic_module_callback_http_filter_config_define_counter(
        config: ConfigPtr,
        name: ModuleBuffer,
        label_names: *const ModuleBuffer,
        label_names_length: usize,
        id: *mut usize,
    ) -> u32;
    /// Adds to a counter of the configuration: from any thread (Envoy's counters are
    /// atomic), for the transport sockets.
    fn envoy_dynamic_module_callback_http_filter_config_increment_counter(
        config: ConfigPtr,
        id: usize,
        label_values: *const ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_config_define_gauge(
        config: ConfigPtr,
        name: ModuleBuffer,
        label_names: *const ModuleBuffer,
        label_names_length: usize,
        id: *mut usize,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_config_increment_gauge(
        config: ConfigPtr,
        id: usize,
        label_values: *const ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_config_decrement_gauge(
        config: ConfigPtr,
        id: usize,
        label_values: *const ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_increment_counter(
        f: StreamPtr,
        id: usize,
        label_values: *const ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> u32;
}

/// One `outbound` filter configuration and its counters' ids, by name (every name
/// of [`counter_names`]).
struct HttpConfig {
    outbound: Outbound,
    counters: Vec<(String, Option<usize>)>,
}

/// One request's filter.
struct HttpStream {
    config: *const HttpConfig,
    /// The pick and the transport it is called over.
    picked: Option<(PeerId, Transport)>,
}

impl HttpStream {
    /// # Safety
    /// The config outlives its streams (Envoy destroys streams first).
    unsafe fn config(&self) -> &HttpConfig {
        &*self.config
    }

    /// # Safety
    /// `f` is this stream's Envoy filter, in a hook.
    unsafe fn count(&self, f: StreamPtr, name: &str) {
        let config = self.config();
        let id = config
            .counters
            .iter()
            .find(|(counter, _)| counter == name)
            .and_then(|(_, id)| *id);
        if let Some(id) = id {
            envoy_dynamic_module_callback_http_filter_increment_counter(
                f,
                id,
                std::ptr::null(),
                0,
                1,
            );
        }
    }
}

/// # Safety
/// `f` is a stream's Envoy filter, in a hook.
unsafe fn header(f: StreamPtr, kind: u32, key: &str) -> Option<String> {
    let mut value = EnvoyBuffer::empty();
    let found = envoy_dynamic_module_callback_http_get_header(
        f,
        kind,
        ModuleBuffer::of(key.as_bytes()),
        &mut value,
        0,
        std::ptr::null_mut(),
    );
    // The value is Envoy's until the hook returns: copied here.
    (found && !value.ptr.is_null()).then(|| String::from_utf8_lossy(value.as_bytes()).into_owned())
}

/// # Safety
/// As [`header`]. `None` removes the header.
unsafe fn set_header(f: StreamPtr, kind: u32, key: &str, value: Option<&str>) {
    let value = match value {
        Some(v) => ModuleBuffer::of(v.as_bytes()),
        None => ModuleBuffer {
            ptr: std::ptr::null(),
            length: 0,
        },
    };
    envoy_dynamic_module_callback_http_set_header(f, kind, ModuleBuffer::of(key.as_bytes()), value);
}

/// # Safety
/// As [`header`].
unsafe fn refuse(f: StreamPtr, refusal: &Refusal) {
    let body = refusal.body();
    let headers = refusal
        .headers()
        .map(|(key, value)| HttpHeader::of(key, value));
    let details = format!("themis_{}", refusal.reason);
    envoy_dynamic_module_callback_http_send_response(
        f,
        refusal.status,
        headers.as_ptr(),
        headers.len(),
        ModuleBuffer::of(body.as_bytes()),
        ModuleBuffer::of(details.as_bytes()),
    );
}

/// # Safety
/// Envoy passes buffers valid for the call; main thread.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    envoy: ConfigPtr,
    name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> *const c_void {
    let made = hook(
        "http_filter_config_new",
        Err("a panic".into()),
        || match name.as_bytes() {
            b"outbound" => Outbound::new(config.as_bytes()),
            other => Err(format!(
                "filter_name {:?}: the module's HTTP filter is `outbound`",
                String::from_utf8_lossy(other)
            )),
        },
    );
    match made {
        Ok(outbound) => {
            let counters = counter_names()
                .into_iter()
                .map(|counter| {
                    let id = define_counter(envoy, &format!("themis.outbound.{counter}"));
                    (counter, id)
                })
                .collect();
            let config = Box::into_raw(Box::new(HttpConfig { outbound, counters }));
            install_socket_counters(envoy, config as usize);
            config.cast_const().cast()
        }
        Err(e) => {
            log(
                4,
                &format!("themis native: refusing the HTTP filter configuration: {e}"),
            );
            std::ptr::null()
        }
    }
}

/// `define_counter` or `define_gauge`: (configuration, name, labels, label count, id).
type Define =
    unsafe extern "C" fn(ConfigPtr, ModuleBuffer, *const ModuleBuffer, usize, *mut usize) -> u32;
/// `config_increment_*` or `config_decrement_gauge`: (configuration, id, label values,
/// their count, value).
type Add = unsafe extern "C" fn(ConfigPtr, usize, *const ModuleBuffer, usize, u64) -> u32;

/// # Safety
/// `envoy` is the configuration being created (main thread, inside `config_new`).
unsafe fn define(envoy: ConfigPtr, how: Define, name: &str) -> Option<usize> {
    let mut id = 0usize;
    let name = ModuleBuffer::of(name.as_bytes());
    let result = how(envoy, name, std::ptr::null(), 0, &mut id);
    (result == METRICS_SUCCESS).then_some(id)
}

/// # Safety
/// As [`define`].
unsafe fn define_counter(envoy: ConfigPtr, name: &str) -> Option<usize> {
    let how = envoy_dynamic_module_callback_http_filter_config_define_counter;
    define(envoy, how, name)
}

/// Defines the transport sockets' counters and gauges on this configuration and routes
/// their changes to it (`metrics`), until `owner` is destroyed.
///
/// # Safety
/// As [`define`].
unsafe fn install_socket_counters(envoy: ConfigPtr, owner: usize) {
    let counters: HashMap<String, usize> = metrics::counter_names()
        .into_iter()
        .filter_map(|name| define_counter(envoy, &name).map(|id| (name, id)))
        .collect();
    let gauges: HashMap<String, usize> = metrics::gauge_names()
        .into_iter()
        .filter_map(|name| {
            let how = envoy_dynamic_module_callback_http_filter_config_define_gauge;
            define(envoy, how, &name).map(|id| (name, id))
        })
        .collect();
    // Envoy's configuration outlives the sink: `config_destroy` uninstalls it
    // first, and waits for changes in flight.
    let envoy = envoy as usize;
    metrics::install(
        owner,
        Arc::new(move |change| {
            let (add, id, value): (Add, _, _) = match change {
                metrics::Change::Count(name) => (
                    envoy_dynamic_module_callback_http_filter_config_increment_counter,
                    counters.get(name),
                    1,
                ),
                metrics::Change::Gauge(name, delta) if delta >= 0 => (
                    envoy_dynamic_module_callback_http_filter_config_increment_gauge,
                    gauges.get(name),
                    delta.unsigned_abs(),
                ),
                metrics::Change::Gauge(name, delta) => (
                    envoy_dynamic_module_callback_http_filter_config_decrement_gauge,
                    gauges.get(name),
                    delta.unsigned_abs(),
                ),
            };
            if let Some(&id) = id {
                // SAFETY: the configuration is alive while the sink is installed.
                unsafe { add(envoy as ConfigPtr, id, std::ptr::null(), 0, value) };
            }
        }),
    );
}

/// # Safety
/// `config` is what `config_new` returned.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(config: *const c_void) {
    metrics::uninstall(config as usize);
    if !config.is_null() {
        let config = Box::from_raw(config.cast_mut().cast::<HttpConfig>());
        hook("http_filter_config_destroy", (), move || drop(config));
    }
}

/// # Safety
/// `config` is what `config_new` returned.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_new(
    config: *const c_void,
    _f: StreamPtr,
) -> *const c_void {
    let stream = HttpStream {
        config: config.cast(),
        picked: None,
    };
    Box::into_raw(Box::new(stream)).cast_const().cast()
}

/// # Safety
/// `stream` is what `filter_new` returned.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_destroy(stream: *const c_void) {
    if !stream.is_null() {
        let stream = Box::from_raw(stream.cast_mut().cast::<HttpStream>());
        hook("http_filter_destroy", (), move || drop(stream));
    }
}

/// # Safety
/// `stream` is what `filter_new` returned; only this worker uses it.
unsafe fn stream<'a>(stream: *const c_void) -> &'a mut HttpStream {
    &mut *stream.cast_mut().cast::<HttpStream>()
}

/// The request: pick an instance and name it to the router, or answer here.
///
/// # Safety
/// Envoy's pointers, valid for the hook.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    f: StreamPtr,
    module: *const c_void,
    _end_of_stream: bool,
) -> u32 {
    let done = hook("http_filter_request_headers", None, || {
        // SAFETY: as this hook's.
        Some(unsafe { request_headers(f, module) })
    });
    done.unwrap_or_else(|| {
        // A bug, caught: this request is answered here, the next one served.
        let refusal = Refusal::new(
            500,
            Rejection::Internal,
            "the sidecar failed on this request",
        );
        hook("http_filter_request_headers (refusing)", (), || {
            // SAFETY: as this hook's.
            unsafe {
                stream(module).count(f, &refusal.reason.counter());
                refuse(f, &refusal);
            }
        });
        HEADERS_STOP
    })
}

/// # Safety
/// As [`envoy_dynamic_module_on_http_filter_request_headers`].
unsafe fn request_headers(f: StreamPtr, module: *const c_void) -> u32 {
    let stream = stream(module);
    stream.count(f, "requests");
    let authority = header(f, REQUEST_HEADERS, ":authority").unwrap_or_default();
    let mut protocol = EnvoyBuffer::empty();
    let http1 = envoy_dynamic_module_callback_http_filter_get_attribute_string(
        f,
        ATTRIBUTE_REQUEST_PROTOCOL,
        &mut protocol,
    ) && protocol.as_bytes() == b"HTTP/1.1";
    // The app's own carry header chose a route before this filter ran.
    let app_carry = header(f, REQUEST_HEADERS, CARRY_HEADER).is_some();
    match stream.config().outbound.on_request(&authority, http1) {
        Ok(route) => {
            for (key, value) in route.headers() {
                set_header(f, REQUEST_HEADERS, key, value);
            }
            if route.carries_http1 || app_carry || stream.config().outbound.speaks_several() {
                // Envoy routed the request before this filter: route it again, by
                // the transport and carry headers as the pick set them.
                envoy_dynamic_module_callback_http_clear_route_cache(f);
            }
            stream.picked = Some((route.picked, route.transport));
            HEADERS_CONTINUE
        }
        Err(refusal) => {
            stream.count(f, &refusal.reason.counter());
            refuse(f, &refusal);
            HEADERS_STOP
        }
    }
}

/// The response: who answered (the id the upstream connection proved; anything the
/// peer's app claimed in these headers is replaced or removed), and whether the
/// instance is to be avoided for a while.
///
/// # Safety
/// Envoy's pointers, valid for the hook.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    f: StreamPtr,
    module: *const c_void,
    _end_of_stream: bool,
) -> u32 {
    // A bug, caught: the response goes on without the peer's headers, which the app
    // then does not have (`x-themis-peer-id` is never the peer's own claim).
    hook("http_filter_response_headers", HEADERS_CONTINUE, || {
        // SAFETY: as this hook's.
        unsafe { response_headers(f, module) }
    })
}

/// # Safety
/// As [`envoy_dynamic_module_on_http_filter_response_headers`].
unsafe fn response_headers(f: StreamPtr, module: *const c_void) -> u32 {
    let stream = stream(module);
    let Some((picked, transport)) = stream.picked else {
        return HEADERS_CONTINUE;
    };
    let mut flags = 0u64;
    envoy_dynamic_module_callback_http_filter_get_attribute_int(
        f,
        ATTRIBUTE_RESPONSE_FLAGS,
        &mut flags,
    );
    let connection = Some(envoy_dynamic_module_callback_http_get_upstream_connection_id(f))
        .filter(|&id| id != 0);
    let answered = stream
        .config()
        .outbound
        .on_response(picked, transport, connection, flags);
    if answered.unreachable {
        stream.count(f, "peer_unreachable");
    }
    let peer = answered.peer.as_ref();
    set_header(
        f,
        RESPONSE_HEADERS,
        "x-themis-peer-id",
        peer.map(|p| p.id.as_str()),
    );
    set_header(
        f,
        RESPONSE_HEADERS,
        "x-themis-peer-service",
        peer.and_then(|p| p.service.as_deref()),
    );
    HEADERS_CONTINUE
}

/// A hook 1.40 requires that this filter does not use: it ignores its arguments and
/// returns `$value` (`Continue`, 0, for the status hooks).
macro_rules! unused_hook {
    ($name:ident($($arg:ty),* $(,)?) $(-> $ret:ty = $value:expr)?) => {
        #[no_mangle]
        pub extern "C" fn $name($(_: $arg),*) $(-> $ret)? {
            $($value)?
        }
    };
}

type Module = *const c_void;

unused_hook!(envoy_dynamic_module_on_http_filter_request_body(StreamPtr, Module, bool) -> u32 = 0);
unused_hook!(envoy_dynamic_module_on_http_filter_request_trailers(StreamPtr, Module) -> u32 = 0);
unused_hook!(envoy_dynamic_module_on_http_filter_response_body(StreamPtr, Module, bool) -> u32 = 0);
unused_hook!(envoy_dynamic_module_on_http_filter_response_trailers(StreamPtr, Module) -> u32 = 0);
unused_hook!(envoy_dynamic_module_on_http_filter_stream_complete(
    StreamPtr, Module
));
unused_hook!(envoy_dynamic_module_on_http_filter_scheduled(
    StreamPtr, Module, u64
));
// (callout id, result, headers, count, body chunks, count)
unused_hook!(
    envoy_dynamic_module_on_http_filter_http_callout_done(
        StreamPtr,
        Module,
        u64,
        u32,
        *const c_void,
        usize,
        *const c_void,
        usize,
    )
);
// (stream id, headers, count, end of stream)
unused_hook!(
    envoy_dynamic_module_on_http_filter_http_stream_headers(
        StreamPtr,
        Module,
        u64,
        *const c_void,
        usize,
        bool,
    )
);
unused_hook!(
    envoy_dynamic_module_on_http_filter_http_stream_data(
        StreamPtr,
        Module,
        u64,
        *const c_void,
        usize,
        bool,
    )
);
unused_hook!(
    envoy_dynamic_module_on_http_filter_http_stream_trailers(
        StreamPtr,
        Module,
        u64,
        *const c_void,
        usize,
    )
);
unused_hook!(envoy_dynamic_module_on_http_filter_http_stream_complete(
    StreamPtr, Module, u64
));
// (stream id, reset reason)
unused_hook!(envoy_dynamic_module_on_http_filter_http_stream_reset(
    StreamPtr, Module, u64, u32
));
unused_hook!(
    envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
        StreamPtr, Module
    )
);
unused_hook!(
    envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
        StreamPtr, Module
    )
);
