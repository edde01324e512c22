//! TLS to an `https://` upstream (proxy mode): rustls with the `ring` provider, the
//! operator's CA file or the system's roots, an optional client certificate (mTLS),
//! and the host name checked against the upstream URL's host — or the name
//! `--upstream-tls-name` gives, when the URL names an address.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How proxy mode talks TLS to its upstream.
#[derive(Clone, Debug, Default)]
pub struct UpstreamTls {
    /// The CA certificates (PEM) the upstream's chain must lead to; the system's roots
    /// without it.
    pub ca_file: Option<PathBuf>,
    /// A client certificate chain (PEM) and its key, for an upstream that asks for one.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// The name the upstream's certificate must carry (and SNI sends), instead of the
    /// URL's host.
    pub server_name: Option<String>,
}

impl UpstreamTls {
    /// Whether anything here is set (it then needs an `https://` upstream).
    pub fn is_set(&self) -> bool {
        self.ca_file.is_some() || self.client_cert.is_some() || self.server_name.is_some()
    }

    /// The rustls client configuration; each error names the flag and what is wrong.
    pub fn client_config(&self) -> Result<ClientConfig, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        match &self.ca_file {
            Some(path) => {
                for cert in certificates(path).map_err(|e| format!("--upstream-ca-file {e}"))? {
                    roots
                        .add(cert)
                        .map_err(|e| format!("--upstream-ca-file {}: {e}", path.display()))?;
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                for cert in found.certs {
                    // A system store may hold certificates rustls can't use: skip them.
                    let _ = roots.add(cert);
                }
                if roots.is_empty() {
                    return Err(
                        "an https:// upstream needs CA certificates to check it by: this \
                                system has none (a FROM scratch container has none): give \
                                --upstream-ca-file"
                            .into(),
                    );
                }
            }
        }
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots);
        match &self.client_cert {
            None => Ok(builder.with_no_client_auth()),
            Some((cert, key)) => {
                let chain =
                    certificates(cert).map_err(|e| format!("--upstream-client-cert {e}"))?;
                let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                    format!(
                        "--upstream-client-key {}: no usable private key (PEM): {e}",
                        key.display()
                    )
                })?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| format!("--upstream-client-cert, --upstream-client-key: {e}"))
            }
        }
    }

    /// The name to check the upstream's certificate against, when not the URL's host.
    pub fn server_name(&self) -> Result<Option<ServerName<'static>>, String> {
        self.server_name
            .as_deref()
            .map(|name| {
                ServerName::try_from(name.to_owned()).map_err(|_| {
                    format!("--upstream-tls-name {name:?} is not a DNS name or an IP address")
                })
            })
            .transpose()
    }
}

/// The PEM certificates in `path`, at least one.
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{}: cannot read it: {e}", path.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: not PEM certificates: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: holds no certificate", path.display()));
    }
    Ok(certs)
}
