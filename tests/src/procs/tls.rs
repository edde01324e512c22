//! Certificates for the TLS tests.

use super::temp_dir;
use std::path::PathBuf;
use std::process::Command;

/// A throwaway certificate authority (openssl): a CA, a server certificate for
/// `localhost` and 127.0.0.1 signed by it, and an unrelated CA that must be refused.
pub struct TestCa {
    dir: PathBuf,
    /// The CA certificate (PEM).
    pub ca: PathBuf,
    /// The server certificate (PEM), signed by `ca`.
    pub server_cert: PathBuf,
    /// Its key.
    pub server_key: PathBuf,
    /// A CA that did not sign the server certificate.
    pub wrong_ca: PathBuf,
}

impl TestCa {
    /// Makes the certificates in a temporary directory.
    pub fn new(label: &str) -> TestCa {
        let dir = temp_dir(label);
        let run = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(&dir)
                .output()
                .expect("openssl runs");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let ca_subject = "/CN=idem test CA";
        run(&[
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", ca_subject,
            "-keyout", "ca.key", "-out", "ca.pem",
        ]);
        run(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ]);
        let ext = "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
                   keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n";
        std::fs::write(dir.join("ext.cnf"), ext).unwrap();
        run(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
        ]
        .into_iter()
        .chain(["-extfile", "ext.cnf", "-out", "server.pem"])
        .collect::<Vec<_>>());
        run(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=some other CA",
            "-keyout",
            "wrong.key",
            "-out",
            "wrong.pem",
        ]);
        // Readable by the postgres user, which copies them.
        let _ = Command::new("chmod")
            .args(["-R", "a+rX", dir.to_str().unwrap()])
            .status();
        TestCa {
            ca: dir.join("ca.pem"),
            server_cert: dir.join("server.pem"),
            server_key: dir.join("server.key"),
            wrong_ca: dir.join("wrong.pem"),
            dir,
        }
    }
}

impl TestCa {
    /// The certificates `scripts/compose-certs` makes for compose.yaml (the server's
    /// for `postgres`, `localhost` and 127.0.0.1), with a wrong CA of [`TestCa::new`]'s.
    pub fn from_compose_script(label: &str) -> TestCa {
        let dir = temp_dir(label);
        let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let out = Command::new(repo.join("scripts/compose-certs"))
            .arg(&dir)
            .output()
            .expect("scripts/compose-certs runs");
        assert!(
            out.status.success(),
            "scripts/compose-certs: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let other = TestCa::new(&format!("{label}-other"));
        let wrong_ca = dir.join("wrong.pem");
        std::fs::copy(&other.ca, &wrong_ca).unwrap();
        let _ = Command::new("chmod")
            .args(["-R", "a+rX", dir.to_str().unwrap()])
            .status();
        TestCa {
            ca: dir.join("ca.pem"),
            server_cert: dir.join("server.pem"),
            server_key: dir.join("server.key"),
            wrong_ca,
            dir,
        }
    }
}

impl Drop for TestCa {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
