//! The keys and certificates of one test control plane, made in process: a
//! CA, the API server's serving certificate for 127.0.0.1, and the key that
//! signs service-account tokens (ECDSA P-256: the API server signs ES256).

use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};

pub(crate) struct Pki {
    pub ca_pem: String,
    pub serving_cert_pem: String,
    pub serving_key_pem: String,
    /// PKCS#8, and its public half (the API server wants both files).
    pub service_account_key_pem: String,
    pub service_account_pub_pem: String,
}

pub(crate) fn make() -> Result<Pki, rcgen::Error> {
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name
        .push(DnType::CommonName, "ipsetmgr-envtest-ca");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);

    let serving_key = KeyPair::generate()?;
    let mut serving = CertificateParams::new(vec!["localhost".to_string()])?;
    serving
        .subject_alt_names
        .push(SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()));
    serving
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    let serving_cert = serving.signed_by(&serving_key, &issuer)?;

    let service_account = KeyPair::generate()?;
    Ok(Pki {
        ca_pem: ca_cert.pem(),
        serving_cert_pem: serving_cert.pem(),
        serving_key_pem: serving_key.serialize_pem(),
        service_account_key_pem: service_account.serialize_pem(),
        service_account_pub_pem: service_account.public_key_pem(),
    })
}
