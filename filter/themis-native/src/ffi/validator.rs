//! The certificate validator's hooks (`envoy.tls.cert_validator.dynamic_modules`), as
//! the stock 1.40.0 binary calls them: `do_verify_cert_chain(config_envoy, config,
//! certs, count, host_name, is_server)` returns the 12-byte result below; the error
//! detail goes through `set_error_details`. Verification is synchronous, on the
//! connection's worker, inside BoringSSL's handshake.

use std::ffi::{c_int, c_void};

use super::{hook, log, refused_config, EnvoyBuffer, ModuleBuffer};
use crate::validator::Validator;

/// `envoy_dynamic_module_type_cert_validator_validation_result`: status at 0,
/// detailed status at 4, the alert at 8 and whether there is one at 9 (Envoy's
/// `abi_static_asserts` pin every offset; 12 bytes, aligned to 4).
#[repr(C)]
pub struct ValidationResult {
    status: u32,
    detailed_status: u32,
    tls_alert: u8,
    has_tls_alert: bool,
}

/// `…_validation_status`: Envoy admits only `Successful`; anything else fails.
const STATUS_SUCCESSFUL: u32 = 0;
const STATUS_FAILED: u32 = 1;
/// `…_client_validation_status` (Envoy's `Ssl::ClientValidationStatus` order).
const DETAIL_VALIDATED: u32 = 2;
const DETAIL_FAILED: u32 = 3;

/// TLS alerts (RFC 8446 §6): the certificate proves nothing, or the policy refuses
/// who it proves.
const ALERT_BAD_CERTIFICATE: u8 = 42;
const ALERT_ACCESS_DENIED: u8 = 49;

/// BoringSSL's `SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT`: a peer with no
/// certificate fails the handshake (a caller must present one).
const VERIFY_PEER_REQUIRED: c_int = 0x01 | 0x02;

/// What the session id context hashes besides the validator's name and config.
const DIGEST: &[u8] = b"themis/tls/1";

type ConfigEnvoyPtr = *mut c_void;

extern "C" {
    fn envoy_dynamic_module_callback_cert_validator_set_error_details(
        config: ConfigEnvoyPtr,
        details: ModuleBuffer,
    );
}

fn refused(reason_is_policy: bool) -> ValidationResult {
    ValidationResult {
        status: STATUS_FAILED,
        detailed_status: DETAIL_FAILED,
        tls_alert: if reason_is_policy {
            ALERT_ACCESS_DENIED
        } else {
            ALERT_BAD_CERTIFICATE
        },
        has_tls_alert: true,
    }
}

/// # Safety
/// Envoy passes buffers valid for the call.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_cert_validator_config_new(
    _envoy: ConfigEnvoyPtr,
    name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> *const c_void {
    let made = hook("cert_validator_config_new", Err("a panic".into()), || {
        Validator::new(name.as_bytes(), config.as_bytes())
    });
    refused_config("certificate validator", made)
}

/// # Safety
/// `config` is what `config_new` returned.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_cert_validator_config_destroy(
    config: *const c_void,
) {
    if !config.is_null() {
        let config = Box::from_raw(config.cast_mut().cast::<Validator>());
        hook("cert_validator_config_destroy", (), move || drop(config));
    }
}

/// # Safety
/// `config` is what `config_new` returned; `certs` holds `count` buffers, and they
/// and `host_name` are valid for the call.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_cert_validator_do_verify_cert_chain(
    envoy: ConfigEnvoyPtr,
    config: *const c_void,
    certs: *mut EnvoyBuffer,
    count: usize,
    host_name: EnvoyBuffer,
    is_server: bool,
) -> ValidationResult {
    let validator = &*config.cast::<Validator>();
    let chain: Vec<&[u8]> = match certs.is_null() {
        true => Vec::new(),
        false => std::slice::from_raw_parts(certs, count)
            .iter()
            .map(|c| c.as_bytes())
            .collect(),
    };
    let host_name = host_name.as_bytes();
    let verdict = hook("cert_validator_do_verify_cert_chain", None, || {
        Some(validator.verify(&chain, host_name, is_server))
    });
    match verdict {
        Some(Ok(_)) => ValidationResult {
            status: STATUS_SUCCESSFUL,
            detailed_status: DETAIL_VALIDATED,
            tls_alert: 0,
            has_tls_alert: false,
        },
        Some(Err(close)) => {
            let detail = format!("themis {}: {}", close.reason, close.detail);
            // Envoy copies the detail into the connection's failure reason.
            envoy_dynamic_module_callback_cert_validator_set_error_details(
                envoy,
                ModuleBuffer::of(detail.as_bytes()),
            );
            let policy = matches!(
                close.reason,
                themis_sidecar::reason::Reason::Policy | themis_sidecar::reason::Reason::NoPolicy
            );
            refused(policy)
        }
        // A panic, caught and logged: the handshake fails.
        None => {
            log(
                4,
                "themis native (tls): the validator failed; the handshake is refused",
            );
            refused(false)
        }
    }
}

/// # Safety
/// `config` is what `config_new` returned.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_cert_validator_get_ssl_verify_mode(
    _config: *const c_void,
    _handshaker_provides_certificates: bool,
) -> c_int {
    VERIFY_PEER_REQUIRED
}

/// # Safety
/// `out` is Envoy's; it reads the buffer at once.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_cert_validator_update_digest(
    _config: *const c_void,
    out: *mut ModuleBuffer,
) {
    if !out.is_null() {
        *out = ModuleBuffer::of(DIGEST);
    }
}
