//! A certificate authority made for one test, and a server certificate it signs for
//! `127.0.0.1` (what a private-CA upstream looks like to the gateway).

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

pub struct TestCa {
    /// The CA certificate (PEM): what `ca_file` names.
    pub ca_pem: String,
    /// The server's certificate (PEM) and key (PEM).
    pub cert_pem: String,
    pub key_pem: String,
}

impl TestCa {
    pub fn new(name: &str) -> TestCa {
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().expect("CA key"))
            .expect("CA certificate");
        let key = KeyPair::generate().expect("server key");
        let mut leaf = CertificateParams::new(vec!["127.0.0.1".to_string()]).expect("params");
        leaf.distinguished_name
            .push(DnType::CommonName, "127.0.0.1");
        let cert = leaf.signed_by(&key, &ca).expect("server certificate");
        TestCa {
            ca_pem: ca.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}
