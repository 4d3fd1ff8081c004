//! The rustls client configuration of `rediss://` masters, from the builder's TLS options.
//! Self-contained (rustls and std only): the `redlock` binary's `status` includes this file
//! too, for its blocking probes.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

/// The client configuration every `rediss://` master of a client shares: roots from
/// `ca_file` (PEM; only these are trusted) or else the system's, and a client certificate
/// for mutual TLS. Errors name the file and the problem.
pub(crate) fn client_config(
    ca_file: Option<&Path>,
    client_cert: Option<(&Path, &Path)>,
) -> Result<Arc<ClientConfig>, String> {
    let mut roots = RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let certs = read_certs(path, "CA file (tls_ca_file)")?;
            for cert in certs {
                roots.add(cert).map_err(|e| {
                    format!(
                        "CA file (tls_ca_file) {}: unusable certificate: {e}",
                        path.display()
                    )
                })?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                let why = found
                    .errors
                    .first()
                    .map_or_else(|| "none found".to_string(), |e| e.to_string());
                return Err(format!(
                    "no system trust roots for rediss:// masters ({why}): install the CA \
                     certificates (ca-certificates) or give a CA file (tls_ca_file)"
                ));
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?
        .with_root_certificates(roots);
    let config = match client_cert {
        None => builder.with_no_client_auth(),
        Some((cert_path, key_path)) => {
            let chain = read_certs(cert_path, "client certificate (tls_client_cert)")?;
            let key = PrivateKeyDer::from_pem_file(key_path).map_err(|e| {
                format!(
                    "client key (tls_client_cert) {}: no usable PEM private key: {e}",
                    key_path.display()
                )
            })?;
            builder.with_client_auth_cert(chain, key).map_err(|e| {
                format!(
                    "client certificate {} and key {}: {e}",
                    cert_path.display(),
                    key_path.display()
                )
            })?
        }
    };
    Ok(Arc::new(config))
}

fn read_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{what} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{what} {}: no PEM certificate in it",
            path.display()
        ));
    }
    Ok(certs)
}
