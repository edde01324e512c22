//! TLS to the stores with rustls and the `ring` provider — no OpenSSL anywhere, so the
//! origin links statically.
//!
//! Postgres follows libpq's `sslmode`: `disable` (plain), `prefer` (the default: TLS
//! when the server offers it, unverified), `require` (TLS, unverified), `verify-ca`
//! (the chain) and `verify-full` (the chain and the host name). The CA comes from
//! `sslrootcert` in the URL or from `--database-ca-file`; with one, `prefer` and
//! `require` verify the chain as libpq does, and TLS is required: a server (or a man in
//! the middle) that declines it is refused, never talked to in plain text. Unverified
//! TLS to a host off this machine is logged as a warning. Redis uses `rediss://` URLs
//! and `--redis-ca-file`.

use idem_core::InvalidSetting;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, Error, RootCertStore, SignatureScheme,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How much of the server's certificate is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verify {
    /// Encrypt only (libpq `prefer`/`require` without a CA).
    Nothing,
    /// The chain up to the CA, not the host name (`verify-ca`).
    Chain,
    /// The chain and the host name (`verify-full`).
    Full,
}

/// The PEM certificates in `path`.
pub fn load_ca(path: &Path) -> Result<Vec<CertificateDer<'static>>, InvalidSetting> {
    let pem = std::fs::read(path)
        .map_err(|e| format!("cannot read the CA file {}: {e}", path.display()))?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("the CA file {} is not PEM: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("the CA file {} holds no certificate", path.display()).into());
    }
    Ok(certs)
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A client configuration for `verify`, trusting the certificates in `ca_file`.
pub fn client_config(
    verify: Verify,
    ca_file: Option<&Path>,
) -> Result<ClientConfig, InvalidSetting> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    if verify == Verify::Nothing {
        return Ok(builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Unverified(provider())))
            .with_no_client_auth());
    }
    let ca_file = ca_file.ok_or("verifying the server needs a CA file (sslrootcert=… or --database-ca-file / --redis-ca-file)")?;
    let mut roots = RootCertStore::empty();
    for cert in load_ca(ca_file)? {
        roots
            .add(cert)
            .map_err(|e| format!("unusable CA certificate in {}: {e}", ca_file.display()))?;
    }
    let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(|e| e.to_string())?;
    Ok(match verify {
        Verify::Full => builder.with_webpki_verifier(webpki).with_no_client_auth(),
        _ => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(ChainOnly(webpki)))
            .with_no_client_auth(),
    })
}

/// A Postgres URL split into what tokio-postgres understands and the TLS settings it
/// doesn't (`verify-ca`, `verify-full`, `sslrootcert`).
#[derive(Debug, PartialEq, Eq)]
pub struct PgTls {
    /// The URL with `sslmode` mapped to tokio-postgres's values and `sslrootcert` removed.
    pub url: String,
    /// `None`: no TLS at all (`sslmode=disable`).
    pub verify: Option<Verify>,
    /// The CA file, from the URL.
    pub ca_file: Option<PathBuf>,
}

/// Reads `sslmode` and `sslrootcert` out of `url`.
pub fn split_pg_url(url: &str) -> Result<PgTls, InvalidSetting> {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut kept = Vec::new();
    let mut mode = "prefer".to_owned();
    let mut ca_file = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("sslmode", v)) => mode = v.to_owned(),
            Some(("sslrootcert", v)) => ca_file = Some(PathBuf::from(percent_decode(v))),
            _ => kept.push(pair.to_owned()),
        }
    }
    let (pg_mode, verify) = match mode.as_str() {
        "disable" => ("disable", None),
        "allow" | "prefer" => ("prefer", Some(Verify::Nothing)),
        "require" if ca_file.is_some() => ("require", Some(Verify::Chain)),
        "require" => ("require", Some(Verify::Nothing)),
        "verify-ca" => ("require", Some(Verify::Chain)),
        "verify-full" => ("require", Some(Verify::Full)),
        other => {
            return Err(format!(
                "unknown sslmode {other:?}: use disable, prefer, require, verify-ca or verify-full"
            )
            .into())
        }
    };
    kept.push(format!("sslmode={pg_mode}"));
    Ok(PgTls {
        url: format!("{base}?{}", kept.join("&")),
        verify,
        ca_file,
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Some(b) = std::str::from_utf8(&bytes[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `verify-ca`: the chain must lead to the CA; the name need not match.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(Error::InvalidCertificate(CertificateError::NotValidForName))
            | Err(Error::InvalidCertificate(CertificateError::NotValidForNameContext { .. })) => {
                Ok(ServerCertVerified::assertion())
            }
            other => other,
        }
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.0.verify_tls12_signature(m, c, d)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.0.verify_tls13_signature(m, c, d)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `prefer` / `require` without a CA: encrypted, not authenticated (libpq's semantics).
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_libpq_sslmodes() {
        let t = split_pg_url("postgres://u@h:5432/db?sslmode=verify-full&sslrootcert=%2Ftmp%2Fca.pem&application_name=x").unwrap();
        assert_eq!(
            t.url,
            "postgres://u@h:5432/db?application_name=x&sslmode=require"
        );
        assert_eq!(t.verify, Some(Verify::Full));
        assert_eq!(t.ca_file, Some(PathBuf::from("/tmp/ca.pem")));
        assert_eq!(
            split_pg_url("postgres://h/db").unwrap().verify,
            Some(Verify::Nothing)
        );
        assert_eq!(
            split_pg_url("postgres://h/db?sslmode=disable")
                .unwrap()
                .verify,
            None
        );
        assert_eq!(
            split_pg_url("postgres://h/db?sslmode=require&sslrootcert=/ca")
                .unwrap()
                .verify,
            Some(Verify::Chain)
        );
        assert!(split_pg_url("postgres://h/db?sslmode=sometimes")
            .unwrap_err()
            .message()
            .contains("sslmode"));
        assert!(client_config(Verify::Full, None)
            .unwrap_err()
            .message()
            .contains("CA file"));
        assert!(
            client_config(Verify::Full, Some(Path::new("/nonexistent/ca.pem")))
                .unwrap_err()
                .message()
                .contains("cannot read")
        );
    }
}
