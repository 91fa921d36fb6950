//! The Secrets an engine's settings name (etcd, Patroni, RedisSentinel), read in the request's
//! namespace and turned into the bytes the client builders take: TLS `ca.crt` (required) with
//! `tls.crt` + `tls.key` (both or neither); auth `username` + `password` (UTF-8); a lone
//! `password` (UTF-8, Redis's and Sentinel's `requirepass`).

use std::fmt;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;

use super::EngineError;

/// Client TLS material (PEM) read from the request's TLS Secret.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TlsMaterial {
    pub ca: Vec<u8>,
    /// Client certificate and key, when the Secret has them.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

/// User name and password read from the request's auth Secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Auth {
    pub user: String,
    pub password: String,
}

impl fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsMaterial")
            .field("ca_bytes", &self.ca.len())
            .field("identity", &self.identity.is_some())
            .finish()
    }
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Auth").field("user", &self.user).finish()
    }
}

/// What a database client needs from Secrets; `None` where the spec names no Secret.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    pub tls: Option<TlsMaterial>,
    pub auth: Option<Auth>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("tls", &self.tls.is_some())
            .field("auth_user", &self.auth.as_ref().map(|a| &a.user))
            .finish()
    }
}

/// Reads the TLS and auth Secrets named (either may be `None`) in `namespace`.
pub async fn credentials(
    client: &kube::Client,
    namespace: &str,
    tls_secret: Option<&str>,
    auth_secret: Option<&str>,
) -> Result<Credentials, EngineError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let tls = match tls_secret {
        None => None,
        Some(name) => Some(tls_material(name, &read(&secrets, name).await?)?),
    };
    let auth = match auth_secret {
        None => None,
        Some(name) => Some(auth(name, &read(&secrets, name).await?)?),
    };
    Ok(Credentials { tls, auth })
}

async fn read(secrets: &Api<Secret>, name: &str) -> Result<Secret, EngineError> {
    secrets.get(name).await.map_err(|e| EngineError::Secret {
        name: name.to_string(),
        message: e.to_string(),
    })
}

fn secret_bytes(secret: &Secret, key: &str) -> Option<Vec<u8>> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|v| v.0.clone())
}

fn required(secret: &Secret, name: &str, key: &str) -> Result<Vec<u8>, EngineError> {
    secret_bytes(secret, key).ok_or_else(|| EngineError::Secret {
        name: name.to_string(),
        message: format!("key {key} is missing"),
    })
}

/// `ca.crt` (required), and `tls.crt` + `tls.key` both or neither.
pub fn tls_material(name: &str, secret: &Secret) -> Result<TlsMaterial, EngineError> {
    let ca = required(secret, name, "ca.crt")?;
    let identity = match (
        secret_bytes(secret, "tls.crt"),
        secret_bytes(secret, "tls.key"),
    ) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        _ => {
            return Err(EngineError::Secret {
                name: name.to_string(),
                message: "tls.crt and tls.key must be both present or both absent".to_string(),
            });
        }
    };
    Ok(TlsMaterial { ca, identity })
}

/// `username` and `password`, both required and UTF-8.
pub fn auth(name: &str, secret: &Secret) -> Result<Auth, EngineError> {
    let text = |key: &str| -> Result<String, EngineError> {
        String::from_utf8(required(secret, name, key)?).map_err(|_| EngineError::Secret {
            name: name.to_string(),
            message: format!("key {key} is not UTF-8"),
        })
    };
    Ok(Auth {
        user: text("username")?,
        password: text("password")?,
    })
}

/// The Secret `name`'s key `password` (UTF-8), when a name is given.
pub async fn password(
    client: &kube::Client,
    namespace: &str,
    name: Option<&str>,
) -> Result<Option<String>, EngineError> {
    let Some(name) = name else {
        return Ok(None);
    };
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    password_of(name, &read(&secrets, name).await?).map(Some)
}

/// `password`, required and UTF-8.
pub fn password_of(name: &str, secret: &Secret) -> Result<String, EngineError> {
    String::from_utf8(required(secret, name, "password")?).map_err(|_| EngineError::Secret {
        name: name.to_string(),
        message: "key password is not UTF-8".to_string(),
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;

    use super::*;

    fn secret(data: &[(&str, &[u8])]) -> Secret {
        Secret {
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.to_vec())))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..Secret::default()
        }
    }

    fn message(e: EngineError) -> String {
        match e {
            EngineError::Secret { name, message } => format!("{name}: {message}"),
            other => panic!("not a Secret error: {other}"),
        }
    }

    #[test]
    fn tls_needs_a_ca_and_both_or_neither_of_cert_and_key() {
        let ca_only = tls_material("t", &secret(&[("ca.crt", b"CA")])).unwrap();
        assert_eq!(ca_only.ca, b"CA");
        assert!(ca_only.identity.is_none());
        let full = tls_material(
            "t",
            &secret(&[("ca.crt", b"CA"), ("tls.crt", b"C"), ("tls.key", b"K")]),
        )
        .unwrap();
        assert_eq!(full.identity, Some((b"C".to_vec(), b"K".to_vec())));
        let err = tls_material("t", &secret(&[("tls.crt", b"C")])).unwrap_err();
        assert_eq!(message(err), "t: key ca.crt is missing");
        let err = tls_material("t", &secret(&[("ca.crt", b"CA"), ("tls.key", b"K")])).unwrap_err();
        assert_eq!(
            message(err),
            "t: tls.crt and tls.key must be both present or both absent"
        );
    }

    #[test]
    fn auth_needs_utf8_username_and_password() {
        let a = auth("a", &secret(&[("username", b"root"), ("password", b"pw")])).unwrap();
        assert_eq!((a.user.as_str(), a.password.as_str()), ("root", "pw"));
        let err = auth("a", &secret(&[("username", b"root")])).unwrap_err();
        assert_eq!(message(err), "a: key password is missing");
        let err = auth("a", &secret(&[("username", &[0xff]), ("password", b"pw")])).unwrap_err();
        assert_eq!(message(err), "a: key username is not UTF-8");
        let err = auth("a", &Secret::default()).unwrap_err();
        assert_eq!(message(err), "a: key username is missing");
    }

    #[test]
    fn a_password_alone_is_utf8() {
        assert_eq!(
            password_of("p", &secret(&[("password", b"pw")])).unwrap(),
            "pw"
        );
        let err = password_of("p", &secret(&[("username", b"x")])).unwrap_err();
        assert_eq!(message(err), "p: key password is missing");
        let err = password_of("p", &secret(&[("password", &[0xff])])).unwrap_err();
        assert_eq!(message(err), "p: key password is not UTF-8");
    }
}
