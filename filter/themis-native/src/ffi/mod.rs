//! The one `unsafe` module: the subset of Envoy 1.40's dynamic-module C ABI this
//! module uses, declared here from the ABI as the stock 1.40.0 binary implements it
//! (`docs/FILTER.md`, "The native runtime", says how it was checked), and the hooks
//! Envoy calls, each handing over to safe code at once.
//!
//! Envoy owns the connection objects; the module owns what it returns from the `new`
//! hooks (a `Box`, given back in `destroy`). Every hook of one connection runs on that
//! connection's worker thread.

#![allow(unsafe_code)]

use std::ffi::{c_char, c_void};

mod guard;
mod http;
mod validator;

use crate::filter::{InboundFilter, InboundFilterConfig};
use crate::socket::{Factory, Io, IoStatus};
pub use guard::message as panic_message;
use guard::{hook, Entered, Slot};

/// What `envoy_dynamic_module_on_program_init` returns: the ABI this module was
/// written against. (1.40 only warns on a mismatch, so `Factory::new` also checks
/// nothing else; the docs say which Envoy runs this module.)
const ABI_VERSION: &[u8] = b"v0.2.0\0";

#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnvoyBuffer {
    ptr: *const c_char,
    length: usize,
}

impl EnvoyBuffer {
    /// Nothing yet, for Envoy to fill in.
    fn empty() -> Self {
        EnvoyBuffer {
            ptr: std::ptr::null(),
            length: 0,
        }
    }

    /// # Safety
    /// `ptr` must be valid for `length` bytes for the returned lifetime.
    unsafe fn as_bytes<'a>(self) -> &'a [u8] {
        if self.ptr.is_null() || self.length == 0 {
            &[]
        } else {
            std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.length)
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ModuleBuffer {
    ptr: *const c_char,
    length: usize,
}

impl ModuleBuffer {
    fn of(bytes: &[u8]) -> Self {
        ModuleBuffer {
            ptr: bytes.as_ptr().cast(),
            length: bytes.len(),
        }
    }
}

#[repr(C)]
pub struct IoResult {
    /// 0 keep open, 1 close, 2 close as a reset.
    action: u32,
    bytes_processed: u64,
    end_stream_read: bool,
}

/// `envoy_dynamic_module_type_transport_socket_io_status`.
const IO_SUCCESS: u32 = 0;
const IO_AGAIN: u32 = 1;

/// `envoy_dynamic_module_type_on_network_filter_data_status`.
const NETWORK_CONTINUE: u32 = 0;
const NETWORK_STOP: u32 = 1;

/// `envoy_dynamic_module_type_network_connection_close_type_NoFlush`: nothing more is
/// written to a connection cut for its peer's revocation.
const CLOSE_NO_FLUSH: u32 = 1;

/// `envoy_dynamic_module_type_network_connection_event_LocalClose`, `_Connected`.
const EVENT_LOCAL_CLOSE: u32 = 1;
const EVENT_CONNECTED: u32 = 2;

type SocketPtr = *mut c_void;
type FilterPtr = *mut c_void;

extern "C" {
    fn envoy_dynamic_module_callback_log(level: u32, message: ModuleBuffer);

    fn envoy_dynamic_module_callback_transport_socket_io_read(
        s: SocketPtr,
        buffer: *mut c_char,
        length: usize,
        bytes_read: *mut usize,
    ) -> u32;
    fn envoy_dynamic_module_callback_transport_socket_io_write(
        s: SocketPtr,
        buffer: *const c_char,
        length: usize,
        bytes_written: *mut usize,
    ) -> u32;
    fn envoy_dynamic_module_callback_transport_socket_io_shutdown_write(s: SocketPtr);
    fn envoy_dynamic_module_callback_transport_socket_read_buffer_add(
        s: SocketPtr,
        data: *const c_char,
        length: usize,
    );
    fn envoy_dynamic_module_callback_transport_socket_write_buffer_drain(
        s: SocketPtr,
        length: usize,
    );
    fn envoy_dynamic_module_callback_transport_socket_write_buffer_get_slices(
        s: SocketPtr,
        slices: *mut EnvoyBuffer,
        slices_count: *mut usize,
    );
    fn envoy_dynamic_module_callback_transport_socket_raise_event(s: SocketPtr, event: u32);
    fn envoy_dynamic_module_callback_transport_socket_should_drain_read_buffer(
        s: SocketPtr,
    ) -> bool;
    fn envoy_dynamic_module_callback_transport_socket_set_is_readable(s: SocketPtr);
    fn envoy_dynamic_module_callback_transport_socket_get_remote_address(
        s: SocketPtr,
        address_out: *mut EnvoyBuffer,
        port_out: *mut u32,
    ) -> bool;
    fn envoy_dynamic_module_callback_transport_socket_get_connection_id(
        s: SocketPtr,
        id_out: *mut u64,
    ) -> bool;

    fn envoy_dynamic_module_callback_network_filter_get_connection_id(f: FilterPtr) -> u64;
    fn envoy_dynamic_module_callback_network_filter_close(f: FilterPtr, close_type: u32);
    // 1.40's pair: the count, then Envoy fills an array of that many (checked in the
    // stock binary: `_size` takes only the filter and returns the span's length).
    fn envoy_dynamic_module_callback_network_filter_get_ssl_dns_sans_size(f: FilterPtr) -> usize;
    fn envoy_dynamic_module_callback_network_filter_get_ssl_dns_sans(
        f: FilterPtr,
        sans: *mut EnvoyBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_network_filter_get_ssl_uri_sans_size(f: FilterPtr) -> usize;
    fn envoy_dynamic_module_callback_network_filter_get_ssl_uri_sans(
        f: FilterPtr,
        sans: *mut EnvoyBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_network_set_filter_state_bytes(
        f: FilterPtr,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
}

/// Envoy's log (levels 0 trace … 5 critical).
pub fn log(level: u32, message: &str) {
    // SAFETY: the buffer lives for the call; Envoy copies it.
    unsafe { envoy_dynamic_module_callback_log(level, ModuleBuffer::of(message.as_bytes())) }
}

/// One connection's transport socket, as Envoy gives it to a hook: valid for the hook.
pub struct EnvoySocket {
    socket: SocketPtr,
    /// The connection asked for `Connected`: raised once the hook has let go of the
    /// connection, since Envoy's callbacks may write on it at once, which calls
    /// `do_write` of the same connection (re-entrant) before `raise_event` returns.
    connected: bool,
}

impl EnvoySocket {
    fn new(socket: SocketPtr) -> Self {
        EnvoySocket {
            socket,
            connected: false,
        }
    }
}

impl Io for EnvoySocket {
    fn read(&mut self, buf: &mut [u8]) -> (IoStatus, usize) {
        let mut n = 0;
        // SAFETY: `buf` is writable for its length; `n` is a valid out pointer.
        let status = unsafe {
            envoy_dynamic_module_callback_transport_socket_io_read(
                self.socket,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut n,
            )
        };
        (status_of(status), n.min(buf.len()))
    }

    fn write(&mut self, data: &[u8]) -> (IoStatus, usize) {
        let mut n = 0;
        // SAFETY: `data` is readable for its length; `n` is a valid out pointer.
        let status = unsafe {
            envoy_dynamic_module_callback_transport_socket_io_write(
                self.socket,
                data.as_ptr().cast(),
                data.len(),
                &mut n,
            )
        };
        (status_of(status), n.min(data.len()))
    }

    fn shutdown_write(&mut self) {
        // SAFETY: the socket pointer is valid during the hook.
        unsafe { envoy_dynamic_module_callback_transport_socket_io_shutdown_write(self.socket) }
    }

    fn deliver(&mut self, plaintext: &[u8]) {
        // SAFETY: Envoy copies the bytes into the read buffer (only inside do_read,
        // which is the only place the driver delivers from).
        unsafe {
            envoy_dynamic_module_callback_transport_socket_read_buffer_add(
                self.socket,
                plaintext.as_ptr().cast(),
                plaintext.len(),
            )
        }
    }

    fn with_write_buffer(&mut self, take: &mut dyn FnMut(&[u8]) -> bool) -> usize {
        // Two calls: the count, then the slices (Envoy writes exactly that many).
        let mut count = 0usize;
        // SAFETY: a null array asks for the count only.
        unsafe {
            envoy_dynamic_module_callback_transport_socket_write_buffer_get_slices(
                self.socket,
                std::ptr::null_mut(),
                &mut count,
            )
        };
        if count == 0 {
            return 0;
        }
        let mut slices = vec![EnvoyBuffer::empty(); count];
        // SAFETY: `slices` holds `count` entries, as many as Envoy reported.
        unsafe {
            envoy_dynamic_module_callback_transport_socket_write_buffer_get_slices(
                self.socket,
                slices.as_mut_ptr(),
                &mut count,
            )
        };
        let mut consumed = 0;
        for slice in &slices[..count.min(slices.len())] {
            // SAFETY: Envoy's slices stay valid until the buffer is drained, which
            // happens after the loop.
            let bytes = unsafe { slice.as_bytes() };
            consumed += bytes.len();
            if !take(bytes) {
                break;
            }
        }
        // SAFETY: drains what `take` consumed (whole slices).
        unsafe {
            envoy_dynamic_module_callback_transport_socket_write_buffer_drain(self.socket, consumed)
        };
        consumed
    }

    fn connected(&mut self) {
        self.connected = true;
    }

    fn wake(&mut self) {
        // SAFETY: the socket pointer is valid during the hook.
        unsafe { envoy_dynamic_module_callback_transport_socket_set_is_readable(self.socket) };
    }

    fn should_yield_reads(&mut self) -> bool {
        // SAFETY: as above.
        let drain = unsafe {
            envoy_dynamic_module_callback_transport_socket_should_drain_read_buffer(self.socket)
        };
        if drain {
            // SAFETY: as above; schedules the next do_read.
            unsafe { envoy_dynamic_module_callback_transport_socket_set_is_readable(self.socket) };
        }
        drain
    }

    fn remote(&mut self) -> Option<std::net::SocketAddr> {
        let mut address = EnvoyBuffer::empty();
        let mut port = 0u32;
        // SAFETY: valid out pointers; the string is Envoy's, valid while the
        // connection lives, and copied here.
        let ok = unsafe {
            envoy_dynamic_module_callback_transport_socket_get_remote_address(
                self.socket,
                &mut address,
                &mut port,
            )
        };
        if !ok {
            return None;
        }
        // SAFETY: see above.
        let text = std::str::from_utf8(unsafe { address.as_bytes() }).ok()?;
        let ip: std::net::IpAddr = text.parse().ok()?;
        Some(std::net::SocketAddr::new(ip, u16::try_from(port).ok()?))
    }

    fn connection_id(&mut self) -> Option<u64> {
        let mut id = 0;
        // SAFETY: valid out pointer.
        unsafe {
            envoy_dynamic_module_callback_transport_socket_get_connection_id(self.socket, &mut id)
        }
        .then_some(id)
    }
}

fn status_of(status: u32) -> IoStatus {
    match status {
        IO_SUCCESS => IoStatus::Done,
        IO_AGAIN => IoStatus::Again,
        _ => IoStatus::Failed,
    }
}

fn result(close: bool, bytes: usize, end_stream_read: bool) -> IoResult {
    IoResult {
        action: u32::from(close),
        bytes_processed: bytes as u64,
        end_stream_read,
    }
}

// ---- hooks Envoy calls --------------------------------------------------------------

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const c_char {
    ABI_VERSION.as_ptr().cast()
}

/// A null configuration: Envoy refuses it (and says so in its log).
fn refused_config<T>(what: &str, made: Result<T, String>) -> *const c_void {
    match made {
        Ok(config) => Box::into_raw(Box::new(config)).cast_const().cast(),
        Err(e) => {
            log(
                4,
                &format!("themis native: refusing the {what} configuration: {e}"),
            );
            std::ptr::null()
        }
    }
}

/// # Safety
/// Envoy passes buffers valid for the call.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_transport_socket_factory_config_new(
    _envoy: *mut c_void,
    name: EnvoyBuffer,
    config: EnvoyBuffer,
    is_upstream: bool,
) -> *const c_void {
    let made = hook(
        "transport_socket_factory_config_new",
        Err("a panic".into()),
        || Factory::new(name.as_bytes(), config.as_bytes(), is_upstream),
    );
    refused_config("transport socket", made)
}

/// # Safety
/// `factory` is what `factory_config_new` returned.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_transport_socket_factory_config_destroy(
    factory: *const c_void,
) {
    if !factory.is_null() {
        let factory = Box::from_raw(factory.cast_mut().cast::<Factory>());
        hook("transport_socket_factory_config_destroy", (), move || {
            drop(factory)
        });
    }
}

/// # Safety
/// `factory` is what `factory_config_new` returned.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_transport_socket_new(
    factory: *const c_void,
    _socket: SocketPtr,
) -> *const c_void {
    let factory = &*factory.cast::<Factory>();
    // A connection that cannot be made is a poisoned slot: its hooks close it.
    let slot = hook("transport_socket_new", None, || Some(factory.connection()))
        .map_or_else(Slot::poisoned, Slot::new);
    Box::into_raw(Box::new(slot)).cast_const().cast()
}

/// # Safety
/// `conn` is what `transport_socket_new` returned.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_transport_socket_destroy(conn: *const c_void) {
    if !conn.is_null() {
        let slot = Box::from_raw(conn.cast_mut().cast::<Slot>());
        hook("transport_socket_destroy", (), move || drop(slot));
    }
}

/// # Safety
/// `conn` is what `transport_socket_new` returned, alive until `destroy`; hooks of one
/// connection run on its worker thread, so a shared reference is all any hook gets
/// (the slot hands out the one `&mut`).
unsafe fn slot<'a>(conn: *const c_void) -> &'a Slot {
    &*conn.cast::<Slot>()
}

/// Runs a transport-socket hook on its connection. Refused (re-entrant, poisoned, or
/// it panicked now): the connection is woken so that its next read closes it, and
/// the hook returns `closed`.
fn on_connection<T>(
    socket: SocketPtr,
    conn: *const c_void,
    name: &str,
    closed: T,
    f: impl FnOnce(&mut crate::socket::Connection, &mut EnvoySocket) -> T,
) -> T {
    // SAFETY: Envoy passes the pointer `transport_socket_new` returned.
    let slot = unsafe { slot(conn) };
    let mut io = EnvoySocket::new(socket);
    match slot.enter(name, |c| f(c, &mut io)) {
        Entered::Ran(value) => {
            if io.connected {
                // SAFETY: the socket pointer is valid during the hook.
                unsafe {
                    envoy_dynamic_module_callback_transport_socket_raise_event(
                        socket,
                        EVENT_CONNECTED,
                    )
                }
            }
            value
        }
        Entered::Refused => {
            if slot.is_poisoned() {
                io.wake();
            }
            closed
        }
    }
}

/// # Safety
/// Envoy's pointers, valid for the hook.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_transport_socket_set_callbacks(
    socket: SocketPtr,
    conn: *const c_void,
) {
    on_connection(socket, conn, "set_callbacks", (), |c, io| c.attached(io));
}

/// # Safety
/// Envoy's pointers, valid for the hook.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_transport_socket_on_connected(
    socket: SocketPtr,
    conn: *const c_void,
) {
    on_connection(socket, conn, "on_connected", (), |c, io| c.on_connected(io));
}

/// # Safety
/// Envoy's pointers, valid for the hook; `result` is Envoy's return slot.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_transport_socket_do_read(
    socket: SocketPtr,
    conn: *const c_void,
) -> IoResult {
    let closed = result(true, 0, false);
    on_connection(socket, conn, "do_read", closed, |c, io| {
        let read = c.do_read(io);
        result(read.close, read.bytes, read.end_stream)
    })
}

/// # Safety
/// Envoy's pointers, valid for the hook.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_transport_socket_do_write(
    socket: SocketPtr,
    conn: *const c_void,
    end_stream: bool,
) -> IoResult {
    let closed = result(true, 0, false);
    on_connection(socket, conn, "do_write", closed, |c, io| {
        let wrote = c.do_write(io, end_stream);
        result(wrote.close, wrote.bytes, false)
    })
}

/// # Safety
/// Envoy's pointers, valid for the hook.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_transport_socket_close(
    _socket: SocketPtr,
    conn: *const c_void,
    event: u32,
    _abort_reset: bool,
) {
    // Deferred while another hook of the connection holds it (a write that failed).
    slot(conn).close(event == EVENT_LOCAL_CLOSE);
}

/// # Safety
/// Envoy's pointers, valid for the hook; Envoy copies `*out` at once.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_transport_socket_get_protocol(
    socket: SocketPtr,
    conn: *const c_void,
    out: *mut ModuleBuffer,
) {
    // `protocol` is one of a few static names, valid after the hook returns.
    let protocol = on_connection(socket, conn, "get_protocol", "", |c, _| c.protocol());
    *out = ModuleBuffer::of(protocol.as_bytes());
}

/// # Safety
/// Envoy's pointers, valid for the hook; Envoy copies `*out` at once.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_transport_socket_get_failure_reason(
    socket: SocketPtr,
    conn: *const c_void,
    out: *mut ModuleBuffer,
) {
    // The reason lives in the connection, which outlives this hook; a refused hook
    // gives a static one.
    let reason = on_connection(socket, conn, "get_failure_reason", None, |c, _| {
        let reason = c.failure_reason();
        Some((reason.as_ptr(), reason.len()))
    });
    *out = match reason {
        Some((ptr, length)) => ModuleBuffer {
            ptr: ptr.cast(),
            length,
        },
        None => ModuleBuffer::of(b"themis: the connection's hook failed"),
    };
}

/// # Safety
/// Envoy's pointers, valid for the hook.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_transport_socket_can_flush_close(
    socket: SocketPtr,
    conn: *const c_void,
) -> bool {
    on_connection(socket, conn, "can_flush_close", false, |c, _| c.is_open())
}

/// # Safety
/// Envoy's pointers, valid for the hook.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_transport_socket_start_secure_transport(
    _socket: SocketPtr,
    _conn: *const c_void,
) -> bool {
    false
}

// ---- the inbound network filter: hands the verified peer to the HCM ---------------

/// # Safety
/// Envoy passes buffers valid for the call.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_network_filter_config_new(
    _envoy: *mut c_void,
    name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> *const c_void {
    let made = hook("network_filter_config_new", Err("a panic".into()), || {
        InboundFilterConfig::new(name.as_bytes(), config.as_bytes())
    });
    refused_config("network filter", made)
}

/// # Safety
/// `config` is what `network_filter_config_new` returned.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_network_filter_config_destroy(
    config: *const c_void,
) {
    if !config.is_null() {
        let config = Box::from_raw(config.cast_mut().cast::<InboundFilterConfig>());
        hook("network_filter_config_destroy", (), move || drop(config));
    }
}

/// # Safety
/// `config` is what `network_filter_config_new` returned; `filter` is Envoy's.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_network_filter_new(
    config: *const c_void,
    filter: FilterPtr,
) -> *const c_void {
    let config = &*config.cast::<InboundFilterConfig>();
    let id = envoy_dynamic_module_callback_network_filter_get_connection_id(filter);
    Box::into_raw(Box::new(config.filter(id)))
        .cast_const()
        .cast()
}

/// # Safety
/// Envoy's pointers, valid for the hook.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_network_filter_new_connection(
    _filter: FilterPtr,
    _module: *const c_void,
) -> u32 {
    0
}

/// # Safety
/// Envoy's pointers, valid for the hook.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_network_filter_read(
    filter: FilterPtr,
    module: *const c_void,
    _length: usize,
    _end_stream: bool,
) -> u32 {
    let module = &mut *module.cast_mut().cast::<InboundFilter>();
    // A bug, caught: no byte goes on to the connection manager (StopIteration).
    hook("network_filter_read", NETWORK_STOP, || {
        let sans = || crate::filter::Sans {
            // SAFETY: the filter pointer is valid during the hook.
            dns: unsafe {
                ssl_sans(
                    filter,
                    envoy_dynamic_module_callback_network_filter_get_ssl_dns_sans_size,
                    envoy_dynamic_module_callback_network_filter_get_ssl_dns_sans,
                )
            },
            // SAFETY: as above.
            uri: unsafe {
                ssl_sans(
                    filter,
                    envoy_dynamic_module_callback_network_filter_get_ssl_uri_sans_size,
                    envoy_dynamic_module_callback_network_filter_get_ssl_uri_sans,
                )
            },
        };
        let read = module.on_read(&sans, &mut |key: &str, value: &str| {
            // SAFETY: buffers valid for the call; Envoy copies them.
            unsafe {
                envoy_dynamic_module_callback_network_set_filter_state_bytes(
                    filter,
                    ModuleBuffer::of(key.as_bytes()),
                    ModuleBuffer::of(value.as_bytes()),
                )
            }
        });
        network_verdict(filter, read)
    })
}

/// Continue, or close the connection now (a revoked peer).
fn network_verdict(filter: FilterPtr, read: crate::filter::Read) -> u32 {
    match read {
        crate::filter::Read::Continue => NETWORK_CONTINUE,
        crate::filter::Read::Close => {
            // SAFETY: the filter pointer is valid during the hook.
            unsafe { envoy_dynamic_module_callback_network_filter_close(filter, CLOSE_NO_FLUSH) };
            NETWORK_STOP
        }
    }
}

/// The peer certificate's SANs of one kind, copied (none without TLS).
///
/// # Safety
/// `filter` is valid for the hook.
unsafe fn ssl_sans(
    filter: FilterPtr,
    size: unsafe extern "C" fn(FilterPtr) -> usize,
    fill: unsafe extern "C" fn(FilterPtr, *mut EnvoyBuffer) -> bool,
) -> Vec<String> {
    let count = size(filter);
    if count == 0 {
        return Vec::new();
    }
    let mut sans = vec![EnvoyBuffer::empty(); count];
    if !fill(filter, sans.as_mut_ptr()) {
        return Vec::new();
    }
    sans.iter()
        .map(|san| String::from_utf8_lossy(san.as_bytes()).into_owned())
        .collect()
}

/// # Safety
/// Envoy's pointers, valid for the hook.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_network_filter_write(
    filter: FilterPtr,
    module: *const c_void,
    _length: usize,
    _end_stream: bool,
) -> u32 {
    let module = &mut *module.cast_mut().cast::<InboundFilter>();
    // A bug, caught: nothing more goes to the caller (StopIteration).
    hook("network_filter_write", NETWORK_STOP, || {
        network_verdict(filter, module.on_write())
    })
}

/// # Safety
/// Envoy's pointers, valid for the hook.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_network_filter_event(
    _filter: FilterPtr,
    _module: *const c_void,
    _event: u32,
) {
}

/// # Safety
/// `module` is what `network_filter_new` returned.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_network_filter_destroy(module: *const c_void) {
    if !module.is_null() {
        let module = Box::from_raw(module.cast_mut().cast::<InboundFilter>());
        hook("network_filter_destroy", (), move || drop(module));
    }
}
