//! In-cluster access to the API server: the `kubernetes` Service's ClusterIP works from pods.
//!
//! The API server listens on the host's loopback only (`127.0.0.1:<port>`, like every control
//! plane component here), which a pod's network namespace cannot reach. Rather than moving the
//! control plane off loopback, the agent does for this one Service what kube-proxy's userspace
//! mode did for every Service: the ClusterIP `198.19.N.1` (first address of the service range,
//! allocated by the API server to `default/kubernetes`, already a SAN of its serving
//! certificate) is added as a /32 to the cluster bridge, pods get a route for the service range
//! via the bridge, and the agent accepts TCP connections on `198.19.N.1:443` and splices each to
//! the API server. TLS passes through untouched: clients verify the API server's certificate and
//! authenticate to it with their service account token, as on any cluster.
//!
//! Containers get the variables a kubelet sets for this Service ([`service_env`]):
//! `KUBERNETES_SERVICE_HOST/PORT/PORT_HTTPS` and the docker-link style `KUBERNETES_PORT*`, so
//! `kube::Client::try_default()` (in-cluster config) works unchanged in a pod. The token, CA and
//! namespace come from the real mechanism: the ServiceAccount admission plugin (on by default)
//! adds a projected volume at `/var/run/secrets/kubernetes.io/serviceaccount` to every pod whose
//! `automountServiceAccountToken` is not false: a `serviceAccountToken` source (the agent asks
//! the TokenRequest API for a token bound to the pod, as a kubelet does), the `kube-root-ca.crt`
//! ConfigMap's `ca.crt` and the namespace from the downward API.

use std::net::{Ipv4Addr, SocketAddr};

use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info, warn};

use crate::state::ClusterState;

/// The port of the `kubernetes` Service (fixed by the API server).
pub const SERVICE_PORT: u16 = 443;

/// The environment a kubelet gives every container for the `kubernetes` Service at `ip`.
pub fn service_env(ip: Ipv4Addr) -> Vec<(String, String)> {
    let port = SERVICE_PORT.to_string();
    let url = format!("tcp://{ip}:{port}");
    let prefix = format!("KUBERNETES_PORT_{port}_TCP");
    vec![
        ("KUBERNETES_SERVICE_HOST".into(), ip.to_string()),
        ("KUBERNETES_SERVICE_PORT".into(), port.clone()),
        ("KUBERNETES_SERVICE_PORT_HTTPS".into(), port.clone()),
        ("KUBERNETES_PORT".into(), url.clone()),
        (prefix.clone(), url),
        (format!("{prefix}_PROTO"), "tcp".into()),
        (format!("{prefix}_PORT"), port),
        (format!("{prefix}_ADDR"), ip.to_string()),
    ]
}

/// Binds the Service address (which must already be on the bridge, see
/// `runtime::prepare_service_address`).
pub async fn bind(state: &ClusterState) -> std::io::Result<TcpListener> {
    let addr = SocketAddr::from((state.kubernetes_service_ip(), SERVICE_PORT));
    let listener = TcpListener::bind(addr).await?;
    info!(%addr, apiserver = state.apiserver_port, "kubernetes Service proxy listening");
    Ok(listener)
}

/// Accepts connections until dropped; each is spliced to the API server on loopback.
pub async fn serve(listener: TcpListener, apiserver_port: u16) {
    let upstream = SocketAddr::from((Ipv4Addr::LOCALHOST, apiserver_port));
    loop {
        match listener.accept().await {
            Ok((client, peer)) => {
                tokio::spawn(splice(client, peer, upstream));
            }
            Err(e) => {
                warn!(error = %e, "kubernetes Service proxy: accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

async fn splice(mut client: TcpStream, peer: SocketAddr, upstream: SocketAddr) {
    let mut server = match TcpStream::connect(upstream).await {
        Ok(s) => s,
        Err(e) => {
            warn!(%peer, error = %e, "kubernetes Service proxy: API server unreachable");
            return;
        }
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    match tokio::io::copy_bidirectional(&mut client, &mut server).await {
        Ok((up, down)) => debug!(%peer, up, down, "kubernetes Service connection closed"),
        Err(e) => debug!(%peer, error = %e, "kubernetes Service connection ended"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_variables_for_the_kubernetes_service() {
        let env = service_env(Ipv4Addr::new(198, 19, 7, 1));
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("KUBERNETES_SERVICE_HOST"), Some("198.19.7.1"));
        assert_eq!(get("KUBERNETES_SERVICE_PORT"), Some("443"));
        assert_eq!(get("KUBERNETES_SERVICE_PORT_HTTPS"), Some("443"));
        assert_eq!(get("KUBERNETES_PORT"), Some("tcp://198.19.7.1:443"));
        assert_eq!(get("KUBERNETES_PORT_443_TCP"), Some("tcp://198.19.7.1:443"));
        assert_eq!(get("KUBERNETES_PORT_443_TCP_PROTO"), Some("tcp"));
        assert_eq!(get("KUBERNETES_PORT_443_TCP_PORT"), Some("443"));
        assert_eq!(get("KUBERNETES_PORT_443_TCP_ADDR"), Some("198.19.7.1"));
        assert_eq!(env.len(), 8);
    }

    #[tokio::test]
    async fn connections_are_spliced_to_the_upstream() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let up_port = upstream.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut s, _) = upstream.accept().await.unwrap();
            let mut buf = [0u8; 4];
            s.read_exact(&mut buf).await.unwrap();
            s.write_all(&[&buf[..], b"-ok"].concat()).await.unwrap();
        });
        let front = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let front_addr = front.local_addr().unwrap();
        let proxy = tokio::spawn(serve(front, up_port));
        let mut c = TcpStream::connect(front_addr).await.unwrap();
        c.write_all(b"ping").await.unwrap();
        let mut got = Vec::new();
        c.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"ping-ok");
        proxy.abort();
    }
}
