//! Which address a request came from, for the sign-in throttle's per-address limit.
//!
//! The TCP peer, unless it is one of the operator's `trusted_proxies`: then the address
//! its forwarding header names. Anyone can send `X-Forwarded-For` or `Forwarded`, so a
//! header is read only from a peer the operator named, only the one header the operator's
//! proxies set (a proxy that appends to one passes the other through as the client wrote
//! it), and from the right: each hop was added by the proxy before it, and the first
//! address that is not a trusted proxy is the client (every address left of it is the
//! client's own claim). A hop that is not an address (`unknown`, an obfuscated name) ends
//! the walk at the trusted proxy that wrote it.
//!
//! Without `trusted_proxies` behind a proxy every client shares the proxy's address: the
//! per-address limit then counts everyone together, which is why the per-account lock, not
//! the address limit, is what keeps an account safe (see `web.rs`).
//!
//! The throttle counts an IPv6 client by its prefix ([`ClientAddress::throttle_key`],
//! `/64` unless the operator says otherwise): one subscriber is usually given a whole /64
//! (or more), and counting each of its 2^64 addresses apart would give it as many
//! allowances.

use axum::http::HeaderMap;
use ipnet::IpNet;
use std::net::IpAddr;

/// The header the operator's proxies set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ForwardedHeader {
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=...`.
    Forwarded,
}

impl ForwardedHeader {
    pub fn parse(s: &str) -> Option<ForwardedHeader> {
        match s.trim().to_ascii_lowercase().as_str() {
            "x-forwarded-for" => Some(ForwardedHeader::XForwardedFor),
            "forwarded" => Some(ForwardedHeader::Forwarded),
            _ => None,
        }
    }
}

/// The prefix length an IPv6 client is counted by, unless the operator sets another.
pub const DEFAULT_IPV6_PREFIX: u8 = 64;

/// The operator's proxies, and the header they set.
#[derive(Debug, Clone)]
pub struct ClientAddress {
    trusted: Vec<IpNet>,
    header: ForwardedHeader,
    ipv6_prefix: u8,
}

impl Default for ClientAddress {
    fn default() -> Self {
        ClientAddress {
            trusted: Vec::new(),
            header: ForwardedHeader::default(),
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }
}

impl ClientAddress {
    /// `trusted`: networks (CIDR, or single addresses) of the proxies in front of reckon.
    pub fn new(trusted: &[String], header: ForwardedHeader) -> Result<ClientAddress, String> {
        let trusted = trusted
            .iter()
            .map(|s| {
                let s = s.trim();
                s.parse::<IpNet>()
                    .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
                    .map_err(|_| format!("trusted_proxies: {s:?} is not a network or address"))
            })
            .collect::<Result<_, _>>()?;
        Ok(ClientAddress {
            trusted,
            header,
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        })
    }

    /// Count IPv6 clients by their first `bits` bits (1 to 128; 128 counts each address).
    pub fn with_ipv6_prefix(self, bits: u8) -> Result<ClientAddress, String> {
        if !(1..=128).contains(&bits) {
            return Err(format!(
                "throttle_ipv6_prefix must be between 1 and 128, not {bits}"
            ));
        }
        Ok(ClientAddress {
            ipv6_prefix: bits,
            ..self
        })
    }

    /// What the sign-in throttle counts a client by: an IPv4 address as it is, an IPv6
    /// address as its prefix (`2001:db8:1:2::/64`), anything else (`unknown`) as it is.
    pub fn throttle_key(&self, address: &str) -> String {
        match address.parse::<IpAddr>().map(canonical) {
            Ok(IpAddr::V6(v6)) => ipnet::Ipv6Net::new(v6, self.ipv6_prefix)
                .map_or_else(|_| address.to_owned(), |n| n.trunc().to_string()),
            // An IPv4 client (an IPv4-mapped IPv6 address is one) counts as itself.
            Ok(IpAddr::V4(v4)) => v4.to_string(),
            Err(_) => address.to_owned(),
        }
    }

    fn trusts(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.trusted.iter().any(|n| n.contains(&ip))
    }

    /// The client's address for a request from `peer` with `headers` ("unknown" without
    /// a peer, as in-process tests have).
    pub fn of(&self, peer: Option<IpAddr>, headers: &HeaderMap) -> String {
        let Some(peer) = peer.map(canonical) else {
            return "unknown".into();
        };
        if !self.trusts(peer) {
            return peer.to_string();
        }
        let mut client = peer;
        for hop in self.hops(headers).into_iter().rev() {
            match hop {
                Some(ip) if self.trusts(ip) => client = ip,
                Some(ip) => return ip.to_string(),
                None => break,
            }
        }
        client.to_string()
    }

    /// The header's hops, left to right (`None` for one that is not an address).
    fn hops(&self, headers: &HeaderMap) -> Vec<Option<IpAddr>> {
        let name = match self.header {
            ForwardedHeader::XForwardedFor => "x-forwarded-for",
            ForwardedHeader::Forwarded => "forwarded",
        };
        let mut hops = Vec::new();
        for value in headers.get_all(name) {
            let Ok(value) = value.to_str() else {
                hops.push(None);
                continue;
            };
            for element in value.split(',') {
                let hop = match self.header {
                    ForwardedHeader::XForwardedFor => Some(element.trim()),
                    ForwardedHeader::Forwarded => element.split(';').find_map(|pair| {
                        let (k, v) = pair.split_once('=')?;
                        k.trim().eq_ignore_ascii_case("for").then_some(v.trim())
                    }),
                };
                hops.push(hop.and_then(parse_node));
            }
        }
        hops
    }
}

/// An address as a forwarding header writes it: `1.2.3.4`, `1.2.3.4:80`, `"[::1]:80"`,
/// `::1`. Anything else (`unknown`, `_hidden`) is `None`.
fn parse_node(s: &str) -> Option<IpAddr> {
    let s = s.trim().trim_matches('"');
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(canonical(ip));
    }
    if let Some(rest) = s.strip_prefix('[') {
        return rest.split(']').next()?.parse().ok().map(canonical);
    }
    let (host, port) = s.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    host.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

/// `::ffff:a.b.c.d` is the IPv4 address (a dual-stack listener reports IPv4 peers so).
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 @ IpAddr::V4(_) => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(name: &'static str, values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(name, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn a_header_is_read_only_from_a_trusted_proxy_and_from_the_right() {
        let c = ClientAddress::new(
            &["10.0.0.0/8".into(), "127.0.0.1".into()],
            ForwardedHeader::XForwardedFor,
        )
        .unwrap();
        let lb: IpAddr = "10.0.0.5".parse().unwrap();
        let xff = |v: &[&str]| headers("x-forwarded-for", v);
        // An untrusted peer: its header is the client's claim.
        assert_eq!(
            c.of(Some("198.51.100.7".parse().unwrap()), &xff(&["1.1.1.1"])),
            "198.51.100.7"
        );
        // The client wrote "1.1.1.1"; the proxy appended the real peer.
        assert_eq!(
            c.of(Some(lb), &xff(&["1.1.1.1, 203.0.113.9"])),
            "203.0.113.9"
        );
        // Two trusted proxies in a row; headers over several lines.
        assert_eq!(
            c.of(Some(lb), &xff(&["1.1.1.1, 203.0.113.9", "10.0.0.7"])),
            "203.0.113.9"
        );
        // Every hop trusted: the leftmost is the client.
        assert_eq!(c.of(Some(lb), &xff(&["10.1.1.1"])), "10.1.1.1");
        // No header, or an "unknown" hop: the proxy that wrote it.
        assert_eq!(c.of(Some(lb), &HeaderMap::new()), "10.0.0.5");
        assert_eq!(c.of(Some(lb), &xff(&["203.0.113.9, unknown"])), "10.0.0.5");
        // The other header is not read.
        assert_eq!(
            c.of(Some(lb), &headers("forwarded", &["for=203.0.113.9"])),
            "10.0.0.5"
        );
        assert_eq!(c.of(None, &xff(&["1.1.1.1"])), "unknown");
        assert_eq!(
            c.of(
                Some("::ffff:127.0.0.1".parse().unwrap()),
                &xff(&["192.0.2.1"])
            ),
            "192.0.2.1"
        );
    }

    #[test]
    fn forwarded_elements_are_parsed_with_ports_brackets_and_quotes() {
        let c = ClientAddress::new(&["10.0.0.0/8".into()], ForwardedHeader::Forwarded).unwrap();
        let lb: IpAddr = "10.0.0.5".parse().unwrap();
        let fwd = |v: &[&str]| headers("forwarded", v);
        assert_eq!(
            c.of(
                Some(lb),
                &fwd(&["for=1.1.1.1, for=\"[2001:db8::7]:4711\";proto=https"])
            ),
            "2001:db8::7"
        );
        assert_eq!(
            c.of(Some(lb), &fwd(&["proto=https;For=192.0.2.60:8080"])),
            "192.0.2.60"
        );
        assert_eq!(c.of(Some(lb), &fwd(&["for=_hidden"])), "10.0.0.5");
        assert!(ClientAddress::new(&["nonsense".into()], ForwardedHeader::Forwarded).is_err());
    }

    #[test]
    fn ipv6_clients_are_counted_by_their_prefix() {
        let c = ClientAddress::default();
        let keys: Vec<String> = [
            "2001:db8:1:2::1",
            "2001:db8:1:2:ffff::9",
            "2001:db8:1:2:0:0:0:abcd",
        ]
        .iter()
        .map(|a| c.throttle_key(a))
        .collect();
        assert!(keys.iter().all(|k| k == "2001:db8:1:2::/64"), "{keys:?}");
        assert_eq!(c.throttle_key("2001:db8:1:3::1"), "2001:db8:1:3::/64");
        assert_eq!(c.throttle_key("192.0.2.7"), "192.0.2.7");
        assert_eq!(c.throttle_key("::ffff:192.0.2.7"), "192.0.2.7");
        assert_eq!(c.throttle_key("unknown"), "unknown");
        let wide = ClientAddress::default().with_ipv6_prefix(48).unwrap();
        assert_eq!(wide.throttle_key("2001:db8:1:2::1"), "2001:db8:1::/48");
        let each = ClientAddress::default().with_ipv6_prefix(128).unwrap();
        assert_eq!(each.throttle_key("2001:db8::1"), "2001:db8::1/128");
        assert!(ClientAddress::default().with_ipv6_prefix(0).is_err());
        assert!(ClientAddress::default().with_ipv6_prefix(129).is_err());
    }
}
