//! The IPv4 Identification hypotheses a receiver without the IP header tries before solving
//! for it (see [`super::verify`]): what each source sent last.
//!
//! Senders number their datagrams in different ways: an unconnected Linux DF socket sends 0
//! (tried first, always); a connected one counts per socket, one per message, a GSO message's
//! segments taking consecutive Identifications from the message's own (so the next message
//! has the previous message's first + 1, not the last + 1); Linux rxe counts per pair of
//! hosts, whatever QP sends. So per source address and port the last Identification, the
//! first one of the last receive buffer (a GSO message, where the receiver has GRO) and the
//! first one of the last run of equal-size datagrams with consecutive Identifications (the
//! same, most of the time, where it has not) are kept, and per source address the last one.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

/// At most this many sources are remembered; when either table is full it starts over (the
/// flows still active re-learn theirs with one solved datagram each).
const MAX_SOURCES: usize = 4096;

/// One source address and port's last Identifications.
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    last: u16,
    /// The last one that came first in its receive buffer.
    first: u16,
    /// Where the run of equal-size datagrams with consecutive Identifications that `last`
    /// ends began, and the size of `last`'s datagram.
    run: u16,
    len: usize,
}

/// The latest source, kept out of the tables (one source at a time is the common case, and
/// then no datagram hashes).
#[derive(Debug, Clone, Copy)]
struct Latest {
    flow: SocketAddr,
    seen: Seen,
    host_last: u16,
}

#[derive(Debug, Default)]
pub struct IdHints {
    flows: HashMap<SocketAddr, Seen>,
    hosts: HashMap<IpAddr, u16>,
    latest: Option<Latest>,
}

impl IdHints {
    /// The Identifications to try for the `index`th datagram of a receive buffer from `src`
    /// (0 stands for none).
    pub fn for_datagram(&self, src: SocketAddr, index: u16) -> [u16; 5] {
        let (seen, host) = match self.latest {
            Some(l) if l.flow == src => (Some(l.seen), Some(l.host_last)),
            Some(l) if l.flow.ip() == src.ip() => (self.flows.get(&src).copied(), Some(l.host_last)),
            _ => (self.flows.get(&src).copied(), self.hosts.get(&src.ip()).copied()),
        };
        let next = |id: Option<u16>| id.map_or(0, |id| id.wrapping_add(1));
        [index, next(seen.map(|s| s.last)), next(seen.map(|s| s.first)), next(seen.map(|s| s.run)), next(host)]
    }

    /// Records that the `index`th datagram of a receive buffer from `src`, `len` bytes long,
    /// carried `id`.
    pub fn record(&mut self, src: SocketAddr, id: u16, index: u16, len: usize) {
        let update = |old: Option<Seen>| Seen {
            last: id,
            first: if index == 0 { id } else { old.map_or(id, |o| o.first) },
            run: match old {
                Some(o) if o.last.wrapping_add(1) == id && o.len == len => o.run,
                _ => id,
            },
            len,
        };
        if let Some(l) = self.latest.as_mut().filter(|l| l.flow == src) {
            l.seen = update(Some(l.seen));
            l.host_last = id;
            return;
        }
        if let Some(old) = self.latest.take() {
            if self.flows.len() >= MAX_SOURCES && !self.flows.contains_key(&old.flow) {
                self.flows.clear();
            }
            self.flows.insert(old.flow, old.seen);
            if self.hosts.len() >= MAX_SOURCES && !self.hosts.contains_key(&old.flow.ip()) {
                self.hosts.clear();
            }
            self.hosts.insert(old.flow.ip(), old.host_last);
        }
        let seen = update(self.flows.get(&src).copied());
        self.latest = Some(Latest { flow: src, seen, host_last: id });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(port: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], port))
    }

    #[test]
    fn a_flow_a_host_and_a_gso_message_start() {
        let mut h = IdHints::default();
        assert_eq!(h.for_datagram(at(1), 0), [0, 0, 0, 0, 0]);
        // A single, then a GSO message of three segments in one buffer, 100..=102.
        h.record(at(1), 99, 0, 40);
        for k in 0..3 {
            h.record(at(1), 100 + k, k, 1000);
        }
        assert_eq!(h.for_datagram(at(1), 0), [0, 103, 101, 101, 103]);
        // Another port of the same host: only the host's counter is known.
        assert_eq!(h.for_datagram(at(2), 0), [0, 0, 0, 0, 103]);
        h.record(at(2), 103, 0, 40);
        assert_eq!(h.for_datagram(at(1), 0), [0, 103, 101, 101, 104]);
        assert_eq!(h.for_datagram(at(2), 0), [0, 104, 104, 104, 104]);
        // Without GRO each segment is a buffer of its own: the run still marks the message.
        for k in 0..3 {
            h.record(at(3), 200 + k, 0, 1000);
        }
        assert_eq!(h.for_datagram(at(3), 0)[3], 201);
    }

    #[test]
    fn the_tables_start_over_when_full() {
        let mut h = IdHints::default();
        for p in 0..=MAX_SOURCES as u16 + 1 {
            h.record(at(p), p, 0, 40);
        }
        assert!(h.flows.len() <= MAX_SOURCES);
        // The two latest still alternate with their own hints.
        let (a, b) = (at(MAX_SOURCES as u16), at(MAX_SOURCES as u16 + 1));
        h.record(a, 7, 0, 40);
        h.record(b, 9, 0, 40);
        assert_eq!(h.for_datagram(a, 0)[1], 8);
        assert_eq!(h.for_datagram(b, 0)[1], 10);
    }
}
