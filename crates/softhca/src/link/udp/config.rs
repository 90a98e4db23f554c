//! How to open a [`UdpDevice`] ([`UdpConfig`], [`RxMode`]) and the link's counters
//! ([`UdpCounters`]). Imports nothing of the driver or the I/O.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use super::IcrcPolicy;
#[allow(unused_imports)] // named by the docs
use super::UdpDevice;
#[allow(unused_imports)] // named by the docs
use crate::verbs::Context;

/// How the link receives (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RxMode {
    /// A raw socket where permitted, else the UDP socket.
    Auto,
    /// The UDP socket: no privilege, IPv4 ICRC verified per [`IcrcPolicy`].
    #[default]
    Socket,
    /// A raw IPv4 socket (needs CAP_NET_RAW); open fails without it.
    Raw,
}

/// How to open a [`UdpDevice`].
#[derive(Debug, Clone)]
pub struct UdpConfig {
    /// The address to bind; `None`: `SOFTHCA_ADDR`, else the first free 127.0.0.x.
    pub addr: Option<IpAddr>,
    /// A second address (GID 1), of the first's family, where alternate paths start: with it
    /// the device supports Automatic Path Migration (`DeviceAttr::auto_path_mig`). `None`:
    /// `SOFTHCA_ALT_ADDR` if set, else none.
    pub alt_addr: Option<IpAddr>,
    /// Device name (`softhca_udp0` …).
    pub name: String,
    /// Spin instead of sleeping: lowest latency, one core busy.
    pub busy_poll: bool,
    /// Record every datagram sent and received (after verification, before the taps) here.
    pub pcap: Option<PathBuf>,
    pub rx_mode: RxMode,
    pub icrc_policy: IcrcPolicy,
    /// Use UDP GSO on send where the kernel offers it.
    pub gso: bool,
    /// Use UDP GRO on receive where the kernel offers it.
    pub gro: bool,
    /// Send each flow through a socket connected to its peer, with the IPv4 Identification
    /// learned and followed (see "Sending" in the module docs); off: every socket stays
    /// unconnected and IPv4 goes out with Identification 0.
    pub connected: bool,
    /// Middleware on the datagram path (after the capture of `pcap`, if any), in order.
    pub taps: crate::link::Taps,
    /// Carry Raw QPs' packets through packet sockets where the process may open them
    /// (CAP_NET_RAW): Ethertype frames on any device, IPv6 datagrams on an IPv6 one; without
    /// them the device has no Raw QPs.
    pub raw_packets: bool,
}

impl Default for UdpConfig {
    fn default() -> Self {
        UdpConfig {
            addr: None,
            alt_addr: None,
            name: "softhca_udp".into(),
            busy_poll: false,
            pcap: None,
            rx_mode: RxMode::Socket,
            icrc_policy: IcrcPolicy::Solve,
            gso: true,
            gro: true,
            connected: true,
            taps: Default::default(),
            raw_packets: true,
        }
    }
}

impl UdpConfig {
    pub fn addr(mut self, addr: impl Into<IpAddr>) -> Self {
        self.addr = Some(addr.into());
        self
    }
    pub fn alt_addr(mut self, addr: impl Into<IpAddr>) -> Self {
        self.alt_addr = Some(addr.into());
        self
    }
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }
    pub fn busy_poll(mut self, on: bool) -> Self {
        self.busy_poll = on;
        self
    }
    /// Adds a tap (see [`crate::link::tap`]) after those added before.
    pub fn tap(mut self, tap: crate::link::TapHandle) -> Self {
        self.taps.push(tap);
        self
    }
    pub fn pcap(mut self, path: impl Into<PathBuf>) -> Self {
        self.pcap = Some(path.into());
        self
    }
    pub fn rx_mode(mut self, mode: RxMode) -> Self {
        self.rx_mode = mode;
        self
    }
    pub fn icrc_policy(mut self, policy: IcrcPolicy) -> Self {
        self.icrc_policy = policy;
        self
    }
    pub fn gso(mut self, on: bool) -> Self {
        self.gso = on;
        self
    }
    pub fn gro(mut self, on: bool) -> Self {
        self.gro = on;
        self
    }

    pub fn connected(mut self, on: bool) -> Self {
        self.connected = on;
        self
    }

    pub fn raw_packets(mut self, on: bool) -> Self {
        self.raw_packets = on;
        self
    }
}

macro_rules! counters {
    ($($(#[$m:meta])* $name:ident,)*) => {
        /// Link counters (DESIGN rule 7); the device's own are in [`Context::counters`].
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct UdpCounters { $($(#[$m])* pub $name: u64,)* }

        #[derive(Debug, Default)]
        pub(super) struct Stats { $(pub(super) $name: AtomicU64,)* }

        impl Stats {
            pub(super) fn snapshot(&self) -> UdpCounters {
                UdpCounters { $($name: self.$name.load(Ordering::Relaxed),)* }
            }
        }
    };
}

counters! {
    /// Datagrams handed to the device (after GRO splitting and verification).
    rx_datagrams,
    rx_bytes,
    /// `recvmmsg` calls that returned data.
    rx_syscalls,
    /// Receive buffers holding more than one datagram (GRO).
    rx_gro_buffers,
    /// Messages (datagrams, or GRO buffers of several) read from the response queue: the RC,
    /// RD and XRC responses the kernel steered there.
    rx_response_queue,
    /// Times response steering was turned on or off.
    steering_changes,
    /// ICRC checks by how they passed: exactly (IPv6 or raw), by an IPv4 hypothesis, solved.
    rx_icrc_exact,
    rx_icrc_hypothesis,
    rx_icrc_solved,
    /// Drops: no BTH+ICRC, wrong length, truncated, unknown address family, bad ICRC.
    drop_malformed,
    drop_truncated,
    drop_family,
    drop_bad_icrc,
    /// Datagrams not addressed to this device (raw mode) or not to port 4791.
    drop_not_ours,
    /// Raw QPs' packets (Ethertype frames, Raw IPv6 datagrams) received (handed to the
    /// device) and sent, and those the kernel refused.
    rx_raw_packets,
    tx_raw_packets,
    tx_raw_errors,
    tx_datagrams,
    tx_bytes,
    /// `sendmmsg` calls.
    tx_syscalls,
    /// Messages sent as one GSO run, and the datagrams in them.
    tx_gso_messages,
    tx_gso_segments,
    /// Datagrams sent from port 4791 because the flow's port could not be bound.
    tx_port_fallback,
    /// Flows sending through a connected socket, and flows left unconnected because the
    /// Identification could not be learned or stopped matching (see the module docs).
    tx_connected_flows,
    tx_unconnected_flows,
    /// Flow sockets closed: their port's last QP was reset or destroyed, or an opening flow
    /// took the slot of a socket no open flow held.
    tx_flows_closed,
    /// Datagrams the kernel refused (counted, then dropped; RC retransmits).
    tx_errors,
    /// Times the engine slept in ppoll, and doorbell syscalls.
    sleeps,
    doorbells,
    /// Engine turns the application's CQ polls ran (busy-poll, or a spinning application).
    poller_turns,
    /// Naps of the engine thread cut short to stand in for a poller that left datagrams
    /// untaken (its watch found the poller gone, see `link::driver`).
    naps_cut,
}
