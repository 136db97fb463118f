//! A throwaway server that speaks only TLS: a certificate authority and a
//! server certificate for `localhost` and `127.0.0.1` made with the
//! `openssl` command, `ssl = on`, and a `pg_hba.conf` whose TCP lines are all
//! `hostssl`, so a client that does not encrypt is refused. For the tests of
//! clients that must reach managed PostgreSQL services, which require TLS.

use std::fs;
use std::os::unix::fs::{PermissionsExt, chown};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::owner::{SERVER_USER, is_root, lookup_user};
use crate::{Error, ThrowawayServer};

/// A TLS-only throwaway server and the CA file that verifies it.
#[derive(Debug)]
pub struct TlsServer {
    /// The server (dropped: stopped and removed).
    pub server: ThrowawayServer,
    /// The certificate authority's certificate (PEM), for `sslrootcert`.
    pub ca_file: PathBuf,
    dir: PathBuf,
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn openssl(dir: &Path, args: &[&str]) -> Result<(), Error> {
    let mut cmd = Command::new("openssl");
    cmd.args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    let out = cmd
        .output()
        .map_err(|e| Error::io("running openssl (is it installed?)", e))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::io(
            format!("openssl {}", args.join(" ")),
            std::io::Error::other(String::from_utf8_lossy(&out.stderr).into_owned()),
        ))
    }
}

impl TlsServer {
    /// Makes the certificates and starts the server; blocks until it accepts
    /// connections.
    ///
    /// # Errors
    ///
    /// `openssl` missing or failing, or whatever prevented the server's start.
    pub fn start() -> Result<TlsServer, Error> {
        let dir = std::env::temp_dir().join(format!(
            "dbworker-tls-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let made = (|| {
            openssl(
                &dir,
                &[
                    "req",
                    "-x509",
                    "-newkey",
                    "rsa:2048",
                    "-nodes",
                    "-days",
                    "2",
                    "-subj",
                    "/CN=dbworker test CA",
                    "-keyout",
                    "ca.key",
                    "-out",
                    "ca.crt",
                ],
            )?;
            openssl(
                &dir,
                &[
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
                ],
            )?;
            fs::write(
                dir.join("san.ext"),
                "subjectAltName = DNS:localhost, IP:127.0.0.1\n",
            )
            .map_err(|e| Error::io("writing san.ext", e))?;
            openssl(
                &dir,
                &[
                    "x509",
                    "-req",
                    "-in",
                    "server.csr",
                    "-CA",
                    "ca.crt",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-days",
                    "2",
                    "-extfile",
                    "san.ext",
                    "-out",
                    "server.crt",
                ],
            )?;
            // Local connections (pg_ctl) stay plain; every TCP one must encrypt.
            fs::write(
                dir.join("pg_hba.conf"),
                "local all all trust\nhostssl all all 127.0.0.1/32 trust\nhostssl all all ::1/128 trust\nhostssl replication all 127.0.0.1/32 trust\n",
            )
            .map_err(|e| Error::io("writing pg_hba.conf", e))?;
            let key = dir.join("server.key");
            fs::set_permissions(&key, fs::Permissions::from_mode(0o600))
                .map_err(|e| Error::io("restricting server.key", e))?;
            if is_root() {
                let owner = lookup_user(SERVER_USER)?;
                for file in ["server.key", "server.crt", "pg_hba.conf"] {
                    chown(dir.join(file), Some(owner.uid), Some(owner.gid))
                        .map_err(|e| Error::io(format!("handing {file} to {SERVER_USER}"), e))?;
                }
            }
            Ok::<_, Error>(())
        })();
        if let Err(e) = made {
            let _ = fs::remove_dir_all(&dir);
            return Err(e);
        }
        let setting = |name: &str, file: &str| format!("{name}={}", dir.join(file).display());
        let settings = [
            "ssl=on".to_owned(),
            setting("ssl_cert_file", "server.crt"),
            setting("ssl_key_file", "server.key"),
            setting("hba_file", "pg_hba.conf"),
        ];
        let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
        match ThrowawayServer::start(&settings) {
            Ok(server) => Ok(TlsServer {
                server,
                ca_file: dir.join("ca.crt"),
                dir,
            }),
            Err(e) => {
                let _ = fs::remove_dir_all(&dir);
                Err(e)
            }
        }
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.server.port()
    }
}
