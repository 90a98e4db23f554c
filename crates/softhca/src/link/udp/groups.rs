//! Multicast groups on the UDP link (the device's group table is the transport's, `mcast`).
//!
//! A socket bound to the device's unicast address never gets a datagram addressed to a group,
//! so the device hears group G (the address its MGID names: `::ffff:224.1.2.3` is 224.1.2.3) through
//! a socket of its own bound to G:4791 and joined on the interface that holds the device's
//! address ([`sys::group_socket`]). Every socket so bound gets its own copy, in this process
//! and in others, and IP multicast loops back to the sending host: devices on one machine hear
//! each other's multicast as hosts on a network do. The group's socket is opened when the
//! group gets its first attached QP and closed with its last (the device's group listener),
//! joins the epoll set the engine thread sleeps on, and is read after the device's own sockets
//! on every turn while there is one (taken out of the list first: see [`Groups::snapshot`]).
//!
//! A group of the other address family than the device's (an IPv6 MGID on an IPv4 device) has
//! no socket: the attach is kept, as Linux keeps it, and nothing arrives.

use std::net::{IpAddr, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::sys;
use crate::types::Gid;
use crate::wire::roce::ROCE_V2_PORT;

/// The epoll set of a device's sockets and the sockets of the groups it has joined.
pub(super) struct Groups {
    /// The set the engine thread sleeps on: the device's sockets, then each group's.
    poll: OwnedFd,
    /// The device's address: groups are joined on its interface.
    local: IpAddr,
    /// `sockets` is not empty: read without the lock by every turn.
    any: AtomicBool,
    /// Shared with a turn that reads them (`snapshot`): a socket left while it is read
    /// closes after the read.
    sockets: Mutex<Vec<(IpAddr, Arc<UdpSocket>)>>,
}

impl Groups {
    pub fn new(poll: OwnedFd, local: IpAddr) -> Groups {
        Groups { poll, local, any: AtomicBool::new(false), sockets: Mutex::new(Vec::new()) }
    }

    pub fn poll_fd(&self) -> RawFd {
        self.poll.as_raw_fd()
    }

    /// The group's address on this device's family, if it has one there.
    fn address(&self, mgid: Gid) -> Option<IpAddr> {
        match (mgid.to_ipv4(), self.local) {
            (Some(v4), IpAddr::V4(_)) => Some(IpAddr::V4(v4)),
            (None, IpAddr::V6(_)) => Some(IpAddr::V6(mgid.to_ipv6())),
            _ => None,
        }
    }

    /// Starts hearing `mgid` (the device's listener, on a group's first attach). False when
    /// the socket cannot be opened (another socket holds port 4791 on every address, as Linux
    /// rxe's does).
    pub fn join(&self, mgid: Gid) -> bool {
        let Some(addr) = self.address(mgid) else {
            tracing::debug!(%mgid, local = %self.local, "a group of the other family: nothing to join");
            return true;
        };
        let opened = sys::group_socket(addr, self.local, ROCE_V2_PORT).and_then(|fd| {
            let s = UdpSocket::from(fd);
            let _ = sys::set_buffer(s.as_raw_fd(), libc::SO_RCVBUF, 8 << 20);
            // Only UD QPs attach to groups: their receives show the header's TOS and TTL.
            let _ = sys::report_ip_fields(s.as_raw_fd(), addr.is_ipv6(), true);
            sys::epoll_add(self.poll.as_raw_fd(), s.as_raw_fd()).map(|()| s)
        });
        match opened {
            Ok(s) => {
                let mut list = self.lock();
                list.push((addr, Arc::new(s)));
                self.any.store(true, Ordering::Release);
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, group = %addr, "cannot hear the multicast group");
                false
            }
        }
    }

    /// Stops hearing `mgid` (its last member left): its socket closes, which leaves the group.
    pub fn leave(&self, mgid: Gid) {
        let Some(addr) = self.address(mgid) else { return };
        let mut list = self.lock();
        list.retain(|(a, _)| *a != addr);
        self.any.store(!list.is_empty(), Ordering::Release);
    }

    /// Whether there is a group socket to read.
    pub fn any(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    /// Fills `out` with the group sockets, by group address, for a turn to read without the
    /// lock: delivering what it reads takes the device's group table, which an attach or a
    /// detach holds while it calls `join` or `leave` here.
    pub fn snapshot(&self, out: &mut Vec<(IpAddr, Arc<UdpSocket>)>) {
        out.clear();
        out.extend(self.lock().iter().map(|(a, s)| (*a, s.clone())));
    }

    fn lock(&self) -> MutexGuard<'_, Vec<(IpAddr, Arc<UdpSocket>)>> {
        self.sockets.lock().unwrap_or_else(|e| e.into_inner())
    }
}
