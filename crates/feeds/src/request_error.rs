//! Why a request of a url source failed, as a fixed reason chosen by the
//! error's kind. The Display of hyper's and rustls's errors carries what the
//! peer sent (a certificate's names, say), and a fetch error reaches the
//! policy's status, an API object: no byte from the network may
//! (docs/member-sources.md, "Egress"). So the reasons here are fixed
//! sentences, and the refusals of the egress guard are the guard's own.

use std::error::Error as StdError;
use std::io;

use super::egress::NameRefused;

/// What went wrong, as far as the status says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestFailure {
    #[error("connection refused")]
    ConnectionRefused,
    #[error("the connection was reset")]
    ConnectionReset,
    #[error("timed out connecting")]
    ConnectTimeout,
    #[error("no route to the host")]
    Unreachable,
    #[error("the host name does not resolve")]
    NoAddress,
    #[error("TLS handshake failed: the server's certificate does not match the host")]
    CertificateName,
    #[error("TLS handshake failed: the server's certificate is not signed by a trusted authority")]
    CertificateIssuer,
    #[error("TLS handshake failed: the server's certificate has expired or is not valid yet")]
    CertificateTime,
    #[error("TLS handshake failed: the server's certificate is not valid")]
    Certificate,
    #[error("TLS handshake failed: the server sent a TLS alert")]
    Alert,
    #[error("TLS handshake failed")]
    Tls,
    #[error("the connection closed before a complete response")]
    Incomplete,
    #[error("the response is not valid HTTP/1.1")]
    Protocol,
    #[error("the connection failed")]
    Connect,
    #[error("the request failed")]
    Other,
}

/// Why a request failed: a refusal of the guard, or a fixed reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Classified {
    Refused(NameRefused),
    Failure(RequestFailure),
}

/// The reason of a failed request (hyper-util's client error, or a body's
/// read error): the first cause of a known kind, walking the chain.
pub(crate) fn classify(e: &(dyn StdError + 'static)) -> Classified {
    let mut fallback = RequestFailure::Other;
    let mut cause = Some(e);
    while let Some(c) = cause {
        if let Some(known) = known_cause(c) {
            return known;
        }
        if let Some(h) = c.downcast_ref::<hyper_util::client::legacy::Error>()
            && h.is_connect()
        {
            fallback = RequestFailure::Connect;
        }
        cause = c.source();
    }
    Classified::Failure(fallback)
}

/// What one error of the chain says, if it is of a kind with a reason.
fn known_cause(c: &(dyn StdError + 'static)) -> Option<Classified> {
    if let Some(r) = c.downcast_ref::<NameRefused>() {
        return Some(Classified::Refused(r.clone()));
    }
    if let Some(t) = c.downcast_ref::<rustls::Error>() {
        return Some(Classified::Failure(tls(t)));
    }
    if let Some(io) = c.downcast_ref::<io::Error>() {
        // io::Error's source() skips the error it wraps: look inside first
        // (tokio-rustls hands hyper a rustls error inside one).
        if let Some(known) = io.get_ref().and_then(|inner| known_cause(inner)) {
            return Some(known);
        }
        return io_kind(io.kind()).map(Classified::Failure);
    }
    let h = c.downcast_ref::<hyper::Error>()?;
    let f = if h.is_incomplete_message() || h.is_canceled() || h.is_closed() {
        RequestFailure::Incomplete
    } else if h.is_parse() || h.is_parse_status() || h.is_parse_too_large() {
        RequestFailure::Protocol
    } else if h.is_timeout() {
        RequestFailure::ConnectTimeout
    } else {
        return None;
    };
    Some(Classified::Failure(f))
}

fn io_kind(kind: io::ErrorKind) -> Option<RequestFailure> {
    use io::ErrorKind as K;
    Some(match kind {
        K::ConnectionRefused => RequestFailure::ConnectionRefused,
        K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe => {
            RequestFailure::ConnectionReset
        }
        K::TimedOut => RequestFailure::ConnectTimeout,
        K::HostUnreachable | K::NetworkUnreachable | K::AddrNotAvailable => {
            RequestFailure::Unreachable
        }
        K::NotFound => RequestFailure::NoAddress,
        K::UnexpectedEof => RequestFailure::Incomplete,
        _ => return None,
    })
}

fn tls(e: &rustls::Error) -> RequestFailure {
    use rustls::CertificateError as C;
    match e {
        rustls::Error::InvalidCertificate(c) => match c {
            C::NotValidForName | C::NotValidForNameContext { .. } => {
                RequestFailure::CertificateName
            }
            C::UnknownIssuer | C::BadSignature => RequestFailure::CertificateIssuer,
            C::Expired
            | C::ExpiredContext { .. }
            | C::NotValidYet
            | C::NotValidYetContext { .. } => RequestFailure::CertificateTime,
            _ => RequestFailure::Certificate,
        },
        rustls::Error::AlertReceived(_) => RequestFailure::Alert,
        _ => RequestFailure::Tls,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::{EgressGuard, Setting};

    fn failure(e: &(dyn StdError + 'static)) -> RequestFailure {
        match classify(e) {
            Classified::Failure(f) => f,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_certificate_for_another_name_is_told_without_its_names() {
        let needle = "needle.example";
        let cert =
            rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForNameContext {
                expected: rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap(),
                presented: vec![format!("DnsName({needle:?})")],
            });
        // As tokio-rustls hands it to hyper.
        let io = io::Error::new(io::ErrorKind::InvalidData, cert);
        assert!(io.to_string().contains(needle), "{io}");
        let f = failure(&io);
        assert_eq!(f, RequestFailure::CertificateName);
        assert!(!f.to_string().contains(needle));
    }

    #[test]
    fn io_kinds_and_tls_errors_have_their_reasons() {
        let io = |k| io::Error::new(k, "peer text");
        assert_eq!(
            failure(&io(io::ErrorKind::ConnectionRefused)),
            RequestFailure::ConnectionRefused
        );
        assert_eq!(
            failure(&io(io::ErrorKind::TimedOut)),
            RequestFailure::ConnectTimeout
        );
        assert_eq!(failure(&io(io::ErrorKind::Other)), RequestFailure::Other);
        let expired = rustls::Error::InvalidCertificate(rustls::CertificateError::Expired);
        assert_eq!(failure(&expired), RequestFailure::CertificateTime);
        let alert = rustls::Error::AlertReceived(rustls::AlertDescription::HandshakeFailure);
        assert_eq!(failure(&alert), RequestFailure::Alert);
    }

    #[test]
    fn a_refusal_behind_the_resolver_is_the_guards_own() {
        let refused = EgressGuard::new(Setting::Cluster, &[], &[])
            .check("127.0.0.1".parse().unwrap())
            .unwrap_err();
        let named = NameRefused {
            host: "localhost".into(),
            refused,
        };
        let io = io::Error::new(io::ErrorKind::PermissionDenied, named.clone());
        assert_eq!(classify(&io), Classified::Refused(named));
    }
}
