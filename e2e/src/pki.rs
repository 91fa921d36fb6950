//! The local cluster's PKI: one CA, the apiserver's serving certificate, a client certificate per
//! component, the node agent's kubelet serving certificate and the service-account signing key.
//!
//! Every key is ECDSA P-256 (rcgen's default). Kubernetes 1.20 accepts it everywhere it is used
//! here: TLS serving and client certificates, `--cluster-signing-key-file`, and the
//! service-account signing key (tokens are then signed with ES256), checked on the running
//! control plane. Keys are written as PKCS#8 PEM (`PRIVATE KEY`), which Go's `tls.X509KeyPair`
//! and client-go's `keyutil` both read.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

use crate::state::ClusterState;

/// How long every certificate is valid (a local cluster lives for hours, not years).
const VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// Certificates start being valid this long before they were made (clock skew).
const BACKDATE: Duration = Duration::from_secs(3600);

/// File stems under `DIR/pki` (`<stem>.crt`, `<stem>.key`).
pub const CA: &str = "ca";
pub const APISERVER: &str = "apiserver";
pub const ADMIN: &str = "admin";
pub const CONTROLLER_MANAGER: &str = "controller-manager";
pub const SCHEDULER: &str = "scheduler";
pub const AGENT: &str = "agent";
pub const APISERVER_KUBELET_CLIENT: &str = "apiserver-kubelet-client";
/// The node agent's HTTPS (kubelet API) serving certificate.
pub const KUBELET: &str = "kubelet";
/// Service-account signing key: `sa.key` (private), `sa.pub` (public).
pub const SERVICE_ACCOUNT: &str = "sa";

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("cannot generate {what}: {source}")]
    Generate {
        what: &'static str,
        source: rcgen::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A certificate and its private key, both PEM.
#[derive(Debug, Clone)]
pub struct CertKey {
    pub cert_pem: String,
    pub key_pem: String,
}

/// Everything [`generate`] makes for one cluster.
#[derive(Debug, Clone)]
pub struct Bundle {
    pub ca: CertKey,
    pub apiserver: CertKey,
    pub admin: CertKey,
    pub controller_manager: CertKey,
    pub scheduler: CertKey,
    pub agent: CertKey,
    pub apiserver_kubelet_client: CertKey,
    pub kubelet: CertKey,
    pub service_account_key_pem: String,
    pub service_account_pub_pem: String,
}

impl Bundle {
    /// `(file stem, cert+key)` of every certificate, CA first.
    pub fn certificates(&self) -> [(&'static str, &CertKey); 8] {
        [
            (CA, &self.ca),
            (APISERVER, &self.apiserver),
            (ADMIN, &self.admin),
            (CONTROLLER_MANAGER, &self.controller_manager),
            (SCHEDULER, &self.scheduler),
            (AGENT, &self.agent),
            (APISERVER_KUBELET_CLIENT, &self.apiserver_kubelet_client),
            (KUBELET, &self.kubelet),
        ]
    }
}

/// `DIR/pki/<stem>.crt`
pub fn cert_path(state: &ClusterState, stem: &str) -> PathBuf {
    state.pki_dir().join(format!("{stem}.crt"))
}
/// `DIR/pki/<stem>.key`
pub fn key_path(state: &ClusterState, stem: &str) -> PathBuf {
    state.pki_dir().join(format!("{stem}.key"))
}
/// `DIR/pki/sa.pub`
pub fn service_account_pub_path(state: &ClusterState) -> PathBuf {
    state.pki_dir().join(format!("{SERVICE_ACCOUNT}.pub"))
}

/// The SANs of the apiserver's serving certificate.
pub fn apiserver_sans(state: &ClusterState) -> Result<Vec<SanType>, PkiError> {
    let mut sans = vec![SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST))];
    for name in [
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ] {
        sans.push(dns(name)?);
    }
    sans.push(SanType::IpAddress(IpAddr::V4(
        state.kubernetes_service_ip(),
    )));
    Ok(sans)
}

fn dns(name: &str) -> Result<SanType, PkiError> {
    let ia5 = name.try_into().map_err(|source| PkiError::Generate {
        what: "DNS name",
        source,
    })?;
    Ok(SanType::DnsName(ia5))
}

/// The validity every certificate of a cluster shares.
#[derive(Clone, Copy)]
struct Validity {
    not_before: time::OffsetDateTime,
    not_after: time::OffsetDateTime,
}

/// The cluster's CA: its certificate and key, and the issuer that signs the leaves.
fn new_ca(
    state: &ClusterState,
    validity: Validity,
) -> Result<(CertKey, Issuer<'static, KeyPair>), PkiError> {
    let ca_key = new_key("CA key")?;
    let mut ca_params = CertificateParams::default();
    ca_params.distinguished_name = name(&format!("storage-migrator local CA {}", state.id), None);
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca_params.not_before = validity.not_before;
    ca_params.not_after = validity.not_after;
    let ca_cert = ca_params
        .self_signed(&ca_key)
        .map_err(|source| PkiError::Generate { what: "CA", source })?;
    let ca = CertKey {
        cert_pem: ca_cert.pem(),
        key_pem: ca_key.serialize_pem(),
    };
    Ok((ca, Issuer::new(ca_params, ca_key)))
}

/// A leaf certificate to sign: subject, SANs and extended key usage.
struct Leaf<'a> {
    what: &'static str,
    cn: &'a str,
    org: Option<&'a str>,
    sans: Vec<SanType>,
    usage: ExtendedKeyUsagePurpose,
}

impl<'a> Leaf<'a> {
    /// A client certificate for `cn` (in group `org`, if any).
    fn client(what: &'static str, cn: &'a str, org: Option<&'a str>) -> Self {
        Leaf {
            what,
            cn,
            org,
            sans: vec![],
            usage: ExtendedKeyUsagePurpose::ClientAuth,
        }
    }

    /// A serving certificate for `cn` with `sans`.
    fn server(what: &'static str, cn: &'a str, sans: Vec<SanType>) -> Self {
        Leaf {
            what,
            cn,
            org: None,
            sans,
            usage: ExtendedKeyUsagePurpose::ServerAuth,
        }
    }

    /// A fresh key and its certificate, signed by `issuer`.
    fn sign(
        self,
        issuer: &Issuer<'static, KeyPair>,
        validity: Validity,
    ) -> Result<CertKey, PkiError> {
        let key = new_key(self.what)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = name(self.cn, self.org);
        params.subject_alt_names = self.sans;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![self.usage];
        params.use_authority_key_identifier_extension = true;
        params.not_before = validity.not_before;
        params.not_after = validity.not_after;
        let cert = params
            .signed_by(&key, issuer)
            .map_err(|source| PkiError::Generate {
                what: self.what,
                source,
            })?;
        Ok(CertKey {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// Generates the whole PKI of `state`'s cluster in memory.
pub fn generate(state: &ClusterState) -> Result<Bundle, PkiError> {
    let now = time::OffsetDateTime::now_utc();
    let validity = Validity {
        not_before: now - BACKDATE,
        not_after: now + VALIDITY,
    };
    let (ca, issuer) = new_ca(state, validity)?;
    let sign = |leaf: Leaf<'_>| leaf.sign(&issuer, validity);
    let masters = Some("system:masters");
    let kubelet_sans = vec![
        SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        dns("localhost")?,
    ];
    let sa_key = new_key("service-account key")?;
    Ok(Bundle {
        ca,
        apiserver: sign(Leaf::server(
            "apiserver serving certificate",
            "kube-apiserver",
            apiserver_sans(state)?,
        ))?,
        admin: sign(Leaf::client(
            "admin client certificate",
            "kubernetes-admin",
            masters,
        ))?,
        controller_manager: sign(Leaf::client(
            "controller-manager client certificate",
            "system:kube-controller-manager",
            None,
        ))?,
        scheduler: sign(Leaf::client(
            "scheduler client certificate",
            "system:kube-scheduler",
            None,
        ))?,
        agent: sign(Leaf::client(
            "node agent client certificate",
            "system:node-agent",
            masters,
        ))?,
        apiserver_kubelet_client: sign(Leaf::client(
            "apiserver kubelet client certificate",
            "kube-apiserver-kubelet-client",
            masters,
        ))?,
        kubelet: sign(Leaf::server(
            "kubelet serving certificate",
            "localcluster-kubelet",
            kubelet_sans,
        ))?,
        service_account_key_pem: sa_key.serialize_pem(),
        service_account_pub_pem: sa_key.public_key_pem(),
    })
}

fn new_key(what: &'static str) -> Result<KeyPair, PkiError> {
    KeyPair::generate().map_err(|source| PkiError::Generate { what, source })
}

fn name(cn: &str, org: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    if let Some(org) = org {
        dn.push(DnType::OrganizationName, org);
    }
    dn.push(DnType::CommonName, cn);
    dn
}

/// Writes `bundle` under `DIR/pki`: certificates mode 0644, private keys mode 0600.
pub fn write(state: &ClusterState, bundle: &Bundle) -> Result<(), PkiError> {
    let dir = state.pki_dir();
    std::fs::create_dir_all(&dir).map_err(|source| PkiError::Write {
        path: dir.clone(),
        source,
    })?;
    for (stem, ck) in bundle.certificates() {
        write_file(&cert_path(state, stem), &ck.cert_pem, 0o644)?;
        write_file(&key_path(state, stem), &ck.key_pem, 0o600)?;
    }
    write_file(
        &key_path(state, SERVICE_ACCOUNT),
        &bundle.service_account_key_pem,
        0o600,
    )?;
    write_file(
        &service_account_pub_path(state),
        &bundle.service_account_pub_pem,
        0o644,
    )?;
    Ok(())
}

fn write_file(path: &Path, content: &str, mode: u32) -> Result<(), PkiError> {
    let err = |source| PkiError::Write {
        path: path.to_path_buf(),
        source,
    };
    // Never leave a key readable for a moment: create with the final mode; replace any old file.
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(err)?;
    file.write_all(content.as_bytes()).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use x509_parser::prelude::*;

    fn state(dir: &Path) -> ClusterState {
        ClusterState {
            id: "abc123".into(),
            dir: dir.to_path_buf(),
            bin_dir: PathBuf::from("/bin"),
            etcd_client_port: 1,
            etcd_peer_port: 2,
            apiserver_port: 3,
            controller_manager_port: 4,
            scheduler_port: 5,
            kubelet_ports: vec![6, 7, 8],
            pod_net: 7,
            service_net: 7,
        }
    }

    fn der(pem_text: &str) -> Vec<u8> {
        let (_, pem) = parse_x509_pem(pem_text.as_bytes()).unwrap();
        pem.contents
    }

    fn subject(cert: &X509Certificate<'_>) -> (String, Vec<String>) {
        let cn = cert
            .subject()
            .iter_common_name()
            .next()
            .unwrap()
            .as_str()
            .unwrap()
            .to_string();
        let orgs = cert
            .subject()
            .iter_organization()
            .map(|o| o.as_str().unwrap().to_string())
            .collect();
        (cn, orgs)
    }

    #[test]
    fn certificates_have_the_identities_kubernetes_expects() {
        let s = state(Path::new("/x"));
        let b = generate(&s).unwrap();
        let ca_der = der(&b.ca.cert_pem);
        let (_, ca) = parse_x509_certificate(&ca_der).unwrap();
        assert!(ca.is_ca());

        let expect: [(&CertKey, &str, &[&str], bool); 7] = [
            (&b.apiserver, "kube-apiserver", &[], true),
            (&b.admin, "kubernetes-admin", &["system:masters"], false),
            (
                &b.controller_manager,
                "system:kube-controller-manager",
                &[],
                false,
            ),
            (&b.scheduler, "system:kube-scheduler", &[], false),
            (&b.agent, "system:node-agent", &["system:masters"], false),
            (
                &b.apiserver_kubelet_client,
                "kube-apiserver-kubelet-client",
                &["system:masters"],
                false,
            ),
            (&b.kubelet, "localcluster-kubelet", &[], true),
        ];
        for (ck, cn, orgs, server) in expect {
            let d = der(&ck.cert_pem);
            let (_, cert) = parse_x509_certificate(&d).unwrap();
            assert_eq!(
                subject(&cert),
                (cn.to_string(), orgs.iter().map(|o| o.to_string()).collect())
            );
            assert!(!cert.is_ca());
            cert.verify_signature(Some(ca.public_key())).unwrap();
            assert_eq!(cert.issuer(), ca.subject());
            let eku = cert.extended_key_usage().unwrap().unwrap().value;
            assert_eq!(
                (eku.server_auth, eku.client_auth),
                (server, !server),
                "{cn}"
            );
            assert!(cert.validity().is_valid());
            // The key in the bundle is the certificate's key.
            let key = KeyPair::from_pem(&ck.key_pem).unwrap();
            assert_eq!(
                key.public_key_raw(),
                &*cert.public_key().subject_public_key.data
            );
        }
    }

    #[test]
    fn apiserver_certificate_names_every_address_clients_use() {
        let s = state(Path::new("/x"));
        let b = generate(&s).unwrap();
        let d = der(&b.apiserver.cert_pem);
        let (_, cert) = parse_x509_certificate(&d).unwrap();
        let san = cert.subject_alternative_name().unwrap().unwrap().value;
        let mut dns = vec![];
        let mut ips = vec![];
        for n in &san.general_names {
            match n {
                GeneralName::DNSName(d) => dns.push(d.to_string()),
                GeneralName::IPAddress(ip) => ips.push(ip.to_vec()),
                other => panic!("unexpected SAN {other:?}"),
            }
        }
        assert_eq!(
            dns,
            [
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local"
            ]
        );
        assert_eq!(ips, [vec![127, 0, 0, 1], vec![198, 19, 7, 1]]);
    }

    #[test]
    fn writes_keys_private_and_certs_readable() {
        let dir = std::env::temp_dir().join(format!("sm-pki-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let s = state(&dir);
        let b = generate(&s).unwrap();
        write(&s, &b).unwrap();
        // Writing twice replaces the files.
        write(&s, &b).unwrap();
        for stem in [CA, APISERVER, ADMIN, KUBELET, APISERVER_KUBELET_CLIENT] {
            let m = std::fs::metadata(key_path(&s, stem))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(m & 0o777, 0o600, "{stem}");
            let m = std::fs::metadata(cert_path(&s, stem))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(m & 0o777, 0o644, "{stem}");
        }
        let sa = std::fs::read_to_string(key_path(&s, SERVICE_ACCOUNT)).unwrap();
        assert!(sa.starts_with("-----BEGIN PRIVATE KEY-----"));
        let pubk = std::fs::read_to_string(service_account_pub_path(&s)).unwrap();
        assert!(pubk.starts_with("-----BEGIN PUBLIC KEY-----"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
