//! Which addresses a `url` source may connect to. Anyone who may create an
//! IPSetPolicy can name a URL, and the controller fetches it from inside the
//! cluster: without a guard that is a way to read cloud metadata
//! credentials (169.254.169.254), the API server, or internal admin pages.
//!
//! The guard is checked on the address actually connected to: on the
//! resolved addresses (the HTTP client resolves through
//! [`GuardedResolver`], so DNS cannot route around it, and a name that
//! resolves to a refused address never gets a connection) and on IP
//! literals before the request. An IPv4 address inside IPv6 (mapped, or the
//! NAT64 prefix) is judged as the IPv4 address. The unspecified address
//! (0.0.0.0, `::`) is where Linux connects to loopback: it is opened only by
//! a CIDR naming exactly it, and then judged as the loopback it reaches.
//!
//! Refused by default in a cluster: unspecified, loopback, link-local,
//! multicast, broadcast and reserved, private (RFC 1918, CGNAT 100.64/10,
//! ULA fc00::/7), and the API server's own addresses (its client's, and its
//! endpoints, followed as they change). `--feed-allow-cidr`
//! opens ranges (the API server's addresses only by a CIDR that names that
//! one address), `--feed-deny-cidr` closes more, before any allow. File mode
//! (`apply`, `run`) allows loopback and private ranges by default: the
//! person who writes the policy file is the one who runs it, on their own
//! host, and no API object ever shows what a fetch returned.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, PoisonError, RwLock};
use std::task::{Context, Poll};

use ipsetmgr_ipset::{Member, SetType};

/// One address range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    const fn v4(a: u8, b: u8, c: u8, d: u8, prefix: u8) -> Cidr {
        Cidr {
            addr: IpAddr::V4(Ipv4Addr::new(a, b, c, d)),
            prefix,
        }
    }

    const fn v6(segments: [u16; 8], prefix: u8) -> Cidr {
        let [a, b, c, d, e, f, g, h] = segments;
        Cidr {
            addr: IpAddr::V6(Ipv6Addr::new(a, b, c, d, e, f, g, h)),
            prefix,
        }
    }

    /// Parse a flag's value: one CIDR or address (`0.0.0.0/0` is the two
    /// halves the member parser makes of it).
    pub fn parse(s: &str) -> Result<Vec<Cidr>, String> {
        let parsed = Member::parse_user(SetType::HashNet, s)
            .map_err(|e| format!("{s:?} is not a CIDR: {e}"))?;
        parsed
            .members
            .iter()
            .map(|m| match m {
                Member::Net {
                    addr,
                    prefix,
                    nomatch: false,
                } => Ok(Cidr {
                    addr: *addr,
                    prefix: *prefix,
                }),
                _ => Err(format!("{s:?} is not a CIDR")),
            })
            .collect()
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let shift = 32 - u32::from(self.prefix);
                let mask = u32::MAX.checked_shl(shift).unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let shift = 128 - u32::from(self.prefix);
                let mask = u128::MAX.checked_shl(shift).unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }

    /// Whether this names exactly one address.
    fn is_host(&self, ip: IpAddr) -> bool {
        self.addr == ip
            && self.prefix
                == match ip {
                    IpAddr::V4(_) => 32,
                    IpAddr::V6(_) => 128,
                }
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// The ranges refused by default, and what they are (said in the refusal).
const SPECIAL: &[(Cidr, &str, bool)] = &[
    // (range, what it is, also refused in file mode)
    (Cidr::v4(0, 0, 0, 0, 8), "an unspecified address", true),
    (Cidr::v4(127, 0, 0, 0, 8), "a loopback address", false),
    (
        Cidr::v4(169, 254, 0, 0, 16),
        "link-local (where cloud metadata services answer)",
        true,
    ),
    (Cidr::v4(10, 0, 0, 0, 8), "a private address", false),
    (Cidr::v4(172, 16, 0, 0, 12), "a private address", false),
    (Cidr::v4(192, 168, 0, 0, 16), "a private address", false),
    (
        Cidr::v4(100, 64, 0, 0, 10),
        "a shared (CGNAT) address, private to the provider",
        false,
    ),
    (
        Cidr::v4(192, 0, 0, 0, 24),
        "an IETF protocol assignment (not a public host)",
        true,
    ),
    (Cidr::v4(224, 0, 0, 0, 4), "a multicast address", true),
    (
        Cidr::v4(240, 0, 0, 0, 4),
        "a reserved or broadcast address",
        true,
    ),
    (
        Cidr::v6([0, 0, 0, 0, 0, 0, 0, 0], 128),
        "an unspecified address",
        true,
    ),
    (
        Cidr::v6([0, 0, 0, 0, 0, 0, 0, 1], 128),
        "a loopback address",
        false,
    ),
    (
        Cidr::v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10),
        "link-local",
        true,
    ),
    (
        Cidr::v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10),
        "site-local (private)",
        false,
    ),
    (
        Cidr::v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7),
        "a private (unique local) address",
        false,
    ),
    (
        Cidr::v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8),
        "a multicast address",
        true,
    ),
];

/// Where the guard is used: what its defaults refuse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setting {
    /// The controller: everything in [`SPECIAL`].
    Cluster,
    /// `apply` and `run`: loopback and private ranges are allowed.
    Files,
}

/// The policy of one process.
#[derive(Clone, Debug)]
pub struct EgressGuard {
    setting: Setting,
    allow: Vec<Cidr>,
    deny: Vec<Cidr>,
    /// The API server's addresses (the controller's own client's, and its
    /// endpoints as they change).
    api_server: ApiServerAddresses,
}

/// The API server's addresses, shared between the guard and whoever
/// follows them (the controller watches the EndpointSlices of
/// `default/kubernetes`): the fixed ones (the client's URL host,
/// `KUBERNETES_SERVICE_HOST`) and the endpoints, replaced as they change.
/// A read lock per check: a check is a few comparisons, and the writer
/// changes it only when the API server moves.
#[derive(Clone, Debug, Default)]
pub struct ApiServerAddresses(Arc<RwLock<Known>>);

#[derive(Debug, Default)]
struct Known {
    fixed: Vec<IpAddr>,
    endpoints: Vec<IpAddr>,
}

impl ApiServerAddresses {
    /// Replace the endpoint addresses; whether they changed.
    pub fn set_endpoints(&self, addrs: impl IntoIterator<Item = IpAddr>) -> bool {
        let mut new: Vec<IpAddr> = addrs.into_iter().map(unmap).collect();
        new.sort();
        new.dedup();
        let mut known = self.0.write().unwrap_or_else(PoisonError::into_inner);
        let changed = known.endpoints != new;
        known.endpoints = new;
        changed
    }

    /// Every address, fixed and endpoints, sorted.
    pub fn all(&self) -> Vec<IpAddr> {
        let known = self.0.read().unwrap_or_else(PoisonError::into_inner);
        let mut all: Vec<IpAddr> = known
            .fixed
            .iter()
            .chain(&known.endpoints)
            .copied()
            .collect();
        all.sort();
        all.dedup();
        all
    }

    fn add_fixed(&self, addrs: impl IntoIterator<Item = IpAddr>) {
        let mut known = self.0.write().unwrap_or_else(PoisonError::into_inner);
        known.fixed.extend(addrs.into_iter().map(unmap));
    }

    fn contains(&self, ip: IpAddr) -> bool {
        let known = self.0.read().unwrap_or_else(PoisonError::into_inner);
        known.fixed.contains(&ip) || known.endpoints.contains(&ip)
    }
}

/// Why an address is refused: what it is, and how to allow it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("refused by the egress guard: {ip} is {what}{how}")]
pub struct Refused {
    pub ip: IpAddr,
    pub what: String,
    how: &'static str,
}

/// A host name whose every address the guard refused: the resolver's
/// error, so that the refusal (the guard's words and the URL's host, no
/// byte from the network) is found again behind hyper's (`request_error.rs`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{host} resolves to {}; {refused}", refused.ip)]
pub struct NameRefused {
    pub host: String,
    pub refused: Refused,
}

impl EgressGuard {
    pub fn new(setting: Setting, allow: &[Cidr], deny: &[Cidr]) -> EgressGuard {
        EgressGuard {
            setting,
            allow: allow.to_vec(),
            deny: deny.to_vec(),
            api_server: ApiServerAddresses::default(),
        }
    }

    /// Refuse these addresses too (the API server's), unless an allowed
    /// CIDR names one of them exactly.
    pub fn with_api_server(self, addrs: impl IntoIterator<Item = IpAddr>) -> Self {
        self.api_server.add_fixed(addrs);
        self
    }

    /// The API server's addresses this guard refuses, to follow its
    /// endpoints (shared: a change is seen by every clone of the guard).
    pub fn api_server(&self) -> ApiServerAddresses {
        self.api_server.clone()
    }

    /// Whether a connection to `ip` is allowed.
    pub fn check(&self, ip: IpAddr) -> Result<(), Refused> {
        let ip = unmap(ip);
        let refuse = |what: String, how| Err(Refused { ip, what, how });
        if let Some(d) = self.deny.iter().find(|d| d.contains(ip)) {
            return refuse(format!("in the denied range {d}"), " (--feed-deny-cidr)");
        }
        if ip.is_unspecified() {
            return self.check_unspecified(ip);
        }
        if self.api_server.contains(ip) {
            if self.allow.iter().any(|a| a.is_host(ip)) {
                return Ok(());
            }
            return refuse(
                "an address of the API server".into(),
                "; only --feed-allow-cidr with exactly this address allows it",
            );
        }
        if self.allow.iter().any(|a| a.contains(ip)) {
            return Ok(());
        }
        let special = SPECIAL.iter().find(|(c, _, in_files)| {
            c.contains(ip) && (self.setting == Setting::Cluster || *in_files)
        });
        match special {
            Some((_, what, _)) => refuse(
                what.to_string(),
                " (allow it with --feed-allow-cidr, chart value controller.feedAllowCIDRs)",
            ),
            None => Ok(()),
        }
    }
}

impl EgressGuard {
    /// Linux connects the unspecified address (0.0.0.0, `::`) to loopback,
    /// whatever route a range would suggest: a broad allow (`0.0.0.0/0`)
    /// must not open this host. Only a CIDR naming exactly that address
    /// does, and then the loopback address it reaches is judged (so the API
    /// server on loopback stays closed unless its own address is allowed).
    fn check_unspecified(&self, ip: IpAddr) -> Result<(), Refused> {
        if !self.allow.iter().any(|a| a.is_host(ip)) {
            return Err(Refused {
                ip,
                what: "an unspecified address (it connects to this host's loopback)".into(),
                how: "; only --feed-allow-cidr with exactly this address allows it",
            });
        }
        let reached = match ip {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
        };
        self.check(reached).map_err(|r| Refused {
            ip,
            what: format!(
                "an unspecified address, which connects to {}: {}",
                r.ip, r.what
            ),
            how: r.how,
        })
    }
}

/// The IPv4 address an IPv6 one carries (mapped `::ffff:a.b.c.d`, or the
/// NAT64 well-known prefix `64:ff9b::/96`), else the address itself.
fn unmap(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return IpAddr::V4(v4);
            }
            let s = v6.segments();
            if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                let o = v6.octets();
                return IpAddr::V4(Ipv4Addr::new(o[12], o[13], o[14], o[15]));
            }
            ip
        }
        v4 => v4,
    }
}

/// The host of a URL as an address, when it is an IP literal (the HTTP
/// client connects to those without resolving).
pub fn literal_ip(host: &str) -> Option<IpAddr> {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()
}

/// The HTTP client's resolver: the system's, with every address the guard
/// refuses removed; a name with nothing left fails with the first refusal.
#[derive(Clone)]
pub struct GuardedResolver {
    guard: Arc<EgressGuard>,
}

impl GuardedResolver {
    pub fn new(guard: Arc<EgressGuard>) -> GuardedResolver {
        GuardedResolver { guard }
    }
}

type ResolveFuture = std::pin::Pin<
    Box<
        dyn std::future::Future<Output = Result<std::vec::IntoIter<SocketAddr>, std::io::Error>>
            + Send,
    >,
>;

impl tower::Service<hyper_util::client::legacy::connect::dns::Name> for GuardedResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = std::io::Error;
    type Future = ResolveFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: hyper_util::client::legacy::connect::dns::Name) -> Self::Future {
        let guard = self.guard.clone();
        Box::pin(async move {
            let host = name.as_str().to_string();
            // Port 0: the connector sets the URL's port on what it gets.
            let resolved: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut first_refusal = None;
            let allowed: Vec<SocketAddr> = resolved
                .into_iter()
                .filter(|a| match guard.check(a.ip()) {
                    Ok(()) => true,
                    Err(r) => {
                        first_refusal.get_or_insert(r);
                        false
                    }
                })
                .collect();
            match (allowed.is_empty(), first_refusal) {
                (false, _) => Ok(allowed.into_iter()),
                (true, Some(refused)) => Err(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    NameRefused { host, refused },
                )),
                (true, None) => Err(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("{host} resolves to no address"),
                )),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn cidrs(list: &[&str]) -> Vec<Cidr> {
        list.iter().flat_map(|s| Cidr::parse(s).unwrap()).collect()
    }

    #[test]
    fn a_cluster_refuses_internal_addresses_by_default() {
        let g = EgressGuard::new(Setting::Cluster, &[], &[]);
        for (addr, what) in [
            ("127.0.0.1", "loopback"),
            ("169.254.169.254", "link-local"),
            ("10.1.2.3", "private"),
            ("172.31.0.1", "private"),
            ("192.168.1.1", "private"),
            ("100.100.100.200", "CGNAT"),
            ("0.0.0.0", "unspecified"),
            ("224.0.0.1", "multicast"),
            ("255.255.255.255", "broadcast"),
            ("::1", "loopback"),
            ("fe80::1", "link-local"),
            ("fd00:ec2::254", "private"),
            ("::ffff:169.254.169.254", "link-local"),
            ("64:ff9b::a9fe:a9fe", "link-local"),
        ] {
            let e = g.check(ip(addr)).expect_err(addr);
            assert!(e.to_string().contains(what), "{addr}: {e}");
            assert!(e.to_string().contains("--feed-allow-cidr"), "{e}");
        }
        for addr in ["1.1.1.1", "185.199.108.153", "2606:4700::1111"] {
            assert_eq!(g.check(ip(addr)), Ok(()), "{addr}");
        }
    }

    #[test]
    fn allow_opens_ranges_deny_closes_them_first() {
        let g = EgressGuard::new(
            Setting::Cluster,
            &cidrs(&["10.20.0.0/16", "169.254.169.254"]),
            &cidrs(&["10.20.30.0/24", "1.1.1.1"]),
        );
        assert_eq!(g.check(ip("10.20.1.1")), Ok(()));
        assert_eq!(g.check(ip("169.254.169.254")), Ok(()));
        assert!(g.check(ip("10.21.1.1")).is_err());
        let e = g.check(ip("10.20.30.5")).unwrap_err();
        assert!(e.to_string().contains("denied range 10.20.30.0/24"), "{e}");
        assert!(g.check(ip("1.1.1.1")).is_err());
    }

    #[test]
    fn the_api_server_is_opened_only_by_its_exact_address() {
        let api = [ip("10.96.0.1"), ip("192.168.10.5")];
        let g =
            EgressGuard::new(Setting::Cluster, &cidrs(&["10.0.0.0/8"]), &[]).with_api_server(api);
        assert_eq!(g.check(ip("10.96.0.2")), Ok(()));
        let e = g.check(ip("10.96.0.1")).unwrap_err();
        assert!(e.to_string().contains("the API server"), "{e}");
        let g =
            EgressGuard::new(Setting::Cluster, &cidrs(&["10.96.0.1/32"]), &[]).with_api_server(api);
        assert_eq!(g.check(ip("10.96.0.1")), Ok(()));
    }

    /// Linux connects 0.0.0.0 (and `::`) to loopback: a broad allow range
    /// holding it must not open this host, nor the API server on loopback
    /// (single-node and host-network clusters).
    #[test]
    fn the_unspecified_address_is_opened_only_by_its_exact_address() {
        let unspecified = ["0.0.0.0", "::", "::ffff:0.0.0.0", "64:ff9b::0.0.0.0"];
        let broad = cidrs(&["0.0.0.0/0", "::/0"]);
        let g = EgressGuard::new(Setting::Cluster, &broad, &[]);
        for addr in unspecified {
            let e = g.check(ip(addr)).expect_err(addr);
            assert!(e.to_string().contains("unspecified"), "{addr}: {e}");
            assert!(
                e.to_string().contains("exactly this address"),
                "{addr}: {e}"
            );
        }
        assert_eq!(g.check(ip("1.1.1.1")), Ok(()));
        // In file mode too: a broad range is no exact allow.
        let g = EgressGuard::new(Setting::Files, &broad, &[]);
        for addr in unspecified {
            assert!(g.check(ip(addr)).is_err(), "{addr}");
        }
        // Exactly allowed: then judged as the loopback address it reaches.
        let exact = cidrs(&["0.0.0.0/32", "::/128"]);
        let g = EgressGuard::new(Setting::Cluster, &exact, &[]);
        let e = g.check(ip("0.0.0.0")).unwrap_err();
        assert!(e.to_string().contains("loopback"), "{e}");
        let g = EgressGuard::new(
            Setting::Cluster,
            &cidrs(&["0.0.0.0/32", "::/128", "127.0.0.0/8", "::1"]),
            &[],
        );
        assert_eq!(g.check(ip("0.0.0.0")), Ok(()));
        assert_eq!(g.check(ip("::")), Ok(()));
        // The API server on loopback stays closed through 0.0.0.0 unless its
        // own address is allowed exactly (ranges holding it do not).
        let g = EgressGuard::new(
            Setting::Cluster,
            &cidrs(&["0.0.0.0/32", "::/128", "127.0.0.0/8", "::/0"]),
            &[],
        )
        .with_api_server([ip("127.0.0.1"), ip("::1")]);
        for addr in unspecified {
            let e = g.check(ip(addr)).expect_err(addr);
            assert!(e.to_string().contains("the API server"), "{addr}: {e}");
        }
        let g = EgressGuard::new(
            Setting::Cluster,
            &cidrs(&["0.0.0.0/32", "127.0.0.1/32"]),
            &[],
        )
        .with_api_server([ip("127.0.0.1")]);
        assert_eq!(g.check(ip("0.0.0.0")), Ok(()));
        let g = EgressGuard::new(Setting::Files, &exact, &[]);
        assert_eq!(g.check(ip("0.0.0.0")), Ok(()));
    }

    /// The endpoints move: the guard (and every clone of it, such as the
    /// fetcher's) follows, keeping the fixed addresses.
    #[test]
    fn the_api_servers_endpoints_are_followed() {
        let g = EgressGuard::new(Setting::Cluster, &cidrs(&["10.0.0.0/8"]), &[])
            .with_api_server([ip("10.96.0.1")]);
        let fetcher_copy = g.clone();
        let addresses = g.api_server();
        assert_eq!(g.check(ip("10.244.0.1")), Ok(()));
        assert!(addresses.set_endpoints([ip("10.244.0.1"), ip("::ffff:10.244.0.1")]));
        assert!(!addresses.set_endpoints([ip("10.244.0.1")]));
        let e = fetcher_copy.check(ip("10.244.0.1")).unwrap_err();
        assert!(e.to_string().contains("the API server"), "{e}");
        assert!(addresses.set_endpoints([ip("10.244.0.2")]));
        assert_eq!(fetcher_copy.check(ip("10.244.0.1")), Ok(()));
        assert!(fetcher_copy.check(ip("10.244.0.2")).is_err());
        assert!(fetcher_copy.check(ip("10.96.0.1")).is_err());
        assert_eq!(addresses.all(), [ip("10.96.0.1"), ip("10.244.0.2")]);
    }

    #[test]
    fn file_mode_allows_loopback_and_private_but_not_metadata() {
        let g = EgressGuard::new(Setting::Files, &[], &[]);
        for addr in ["127.0.0.1", "10.1.2.3", "::1", "fd00::1"] {
            assert_eq!(g.check(ip(addr)), Ok(()), "{addr}");
        }
        for addr in ["169.254.169.254", "fe80::1", "0.0.0.0", "224.0.0.1"] {
            assert!(g.check(ip(addr)).is_err(), "{addr}");
        }
    }

    #[test]
    fn flags_parse_as_cidrs() {
        assert_eq!(cidrs(&["10.1.2.3/8"])[0].to_string(), "10.0.0.0/8");
        assert_eq!(cidrs(&["0.0.0.0/0"]).len(), 2);
        assert!(Cidr::parse("10.0.0.0/33").is_err());
        assert!(Cidr::parse("example.com").is_err());
        assert_eq!(literal_ip("[::1]"), Some(ip("::1")));
        assert_eq!(literal_ip("169.254.169.254"), Some(ip("169.254.169.254")));
        assert_eq!(literal_ip("example.com"), None);
    }

    #[tokio::test]
    async fn the_resolver_drops_refused_addresses() {
        use tower::Service;
        let guard = Arc::new(EgressGuard::new(Setting::Cluster, &[], &[]));
        let mut r = GuardedResolver::new(guard);
        let e = r.call("localhost".parse().unwrap()).await.unwrap_err();
        assert!(e.to_string().contains("loopback"), "{e}");
        let guard = Arc::new(EgressGuard::new(Setting::Files, &[], &[]));
        let mut r = GuardedResolver::new(guard);
        let addrs: Vec<SocketAddr> = r
            .call("localhost".parse().unwrap())
            .await
            .unwrap()
            .collect();
        assert!(addrs.iter().all(|a| a.ip().is_loopback()), "{addrs:?}");
    }
}
