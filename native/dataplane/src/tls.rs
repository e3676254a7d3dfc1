//! TLS of the REST and gRPC ports (freshroute.tls.ServerTLS's files, as loaded): rustls with ring's primitives,
//! TLS 1.2 and 1.3, ALPN `http/1.1` or `h2`. A reload swaps the acceptors: new handshakes get the new certificate,
//! open connections stay.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// How long a client may take over its handshake before its connection is closed.
pub const HANDSHAKE: std::time::Duration = std::time::Duration::from_secs(10);

/// An acceptor presenting `cert_pem` (the chain, leaf first) with `key_pem` and offering `alpn`, or what is wrong
/// with them.
pub fn acceptor(cert_pem: &[u8], key_pem: &[u8], alpn: &[u8]) -> Result<TlsAcceptor, String> {
    let mut config = server_config(cert_pem, key_pem, None)?;
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// A store node's read port's acceptor (no ALPN: the port speaks one protocol), requiring client certificates signed
/// by `client_ca_pem` (tls_client_ca) when given; or what is wrong with the files.
pub fn port_acceptor(cert_pem: &[u8], key_pem: &[u8], client_ca_pem: Option<&[u8]>) -> Result<TlsAcceptor, String> {
    Ok(TlsAcceptor::from(Arc::new(server_config(cert_pem, key_pem, client_ca_pem)?)))
}

fn server_config(cert_pem: &[u8], key_pem: &[u8], client_ca_pem: Option<&[u8]>) -> Result<ServerConfig, String> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("the certificate file is not PEM certificates ({e})"))?;
    if chain.is_empty() {
        return Err("the certificate file holds no certificate".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| format!("the key file holds no private key ({e})"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| e.to_string())?;
    let builder = match client_ca_pem {
        None => builder.with_no_client_auth(),
        Some(ca_pem) => {
            let roots = Arc::new(roots(ca_pem, "tls_client_ca")?);
            let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider)
                .build()
                .map_err(|e| format!("tls_client_ca cannot check client certificates ({e})"))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    builder.with_single_cert(chain, key).map_err(|e| format!("the certificate and key are not usable together ({e})"))
}

/// The CA certificates of `ca_pem` (the file of setting `setting`), or what is wrong with them.
fn roots(ca_pem: &[u8], setting: &str) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        let cert = cert.map_err(|e| format!("{setting} is not PEM certificates ({e})"))?;
        roots.add(cert).map_err(|e| format!("{setting} holds a certificate rustls cannot use ({e})"))?;
    }
    if roots.is_empty() {
        return Err(format!("{setting} holds no certificate"));
    }
    Ok(roots)
}

/// A connector to store nodes trusting the CA certificates of `ca_pem` (cluster_ca), presenting `cert_pem` with
/// `key_pem` (cluster_cert, cluster_key) to nodes that require a client certificate; or what is wrong with them.
pub fn connector(ca_pem: &[u8], client: Option<(&[u8], &[u8])>) -> Result<TlsConnector, String> {
    let roots = roots(ca_pem, "cluster_ca")?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some((cert_pem, key_pem)) => {
            let chain = CertificateDer::pem_slice_iter(cert_pem).collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("cluster_cert is not PEM certificates ({e})"))?;
            let key = PrivateKeyDer::from_pem_slice(key_pem)
                .map_err(|e| format!("cluster_key holds no private key ({e})"))?;
            builder.with_client_auth_cert(chain, key)
                .map_err(|e| format!("cluster_cert and cluster_key are not usable together ({e})"))?
        }
    };
    Ok(TlsConnector::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_that_are_not_a_certificate_and_its_key_are_named() {
        let problem = |cert: &[u8], key: &[u8]| acceptor(cert, key, b"h2").err().expect("refused");
        assert!(problem(b"", b"").contains("no certificate"));
        let not_a_cert = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert!(problem(not_a_cert, b"nothing").contains("no private key"));
    }
}
