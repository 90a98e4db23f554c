//! Links: the drivers that own I/O and time and move datagrams between devices (DESIGN rule 1).
//!
//! - [`sim`]: a deterministic in-process fabric with a virtual clock and seeded faults.
//! - [`udp`]: real UDP sockets on port 4791, one engine thread per device, batched I/O.
//! - [`shm`]: the same datagrams through rings in shared memory, for processes of one host.
//! - [`pcap`]: a capture that writes datagrams as Ethernet frames Wireshark can read.
//! - [`tap`]: middleware any link takes on its datagram path (a pcap capture, seeded faults).
//! - `driver`: the engine thread, doorbell and busy-poll turns any OS-facing link reuses
//!   through its `Port` (the UDP link's is `udp::port`); `os`: its eventfd and `ppoll`;
//!   `clock`: the time it and its ports read (the TSC where the kernel's clock is a system call).
//!
//! A link drives devices from outside (`verbs::Context::receive`, `transmit`,
//! `handle_timeout`), so it is the top layer: it may import every layer below, and nothing
//! imports it. What it moves are IP datagrams (RoCEv2, and the Raw IPv6 QPs' packets) and,
//! where it can carry them, the Raw Ethertype QPs' Ethernet frames (`Context::transmit_frame`,
//! `receive_frame`): the sim fabric routes those by MAC, the UDP link sends them through an
//! AF_PACKET socket where the process may open one; a device whose link carries none has no
//! Raw QPs (`DeviceAttr::max_raw_ethy_qp`, `max_raw_ipv6_qp`).
//!
//! The device calls back into its link through hooks the link installs, never by importing
//! it: the doorbell (new work posted), the progress hook (a CQ poll may run a turn), and the
//! raw listener (`Context::set_raw_listener`: the first Raw QP of a type is created or the
//! last destroyed, so that a packet socket hears exactly while such QPs exist, from the
//! moment Create QP returns).

pub(crate) mod clock;
pub(crate) mod driver;
pub(crate) mod os;
pub mod pcap;
pub mod shm;
pub mod sim;
pub mod tap;
pub mod udp;

pub use pcap::{PcapTap, SharedBuf};
pub use sim::{DeviceId, FilterCtx, LinkConfig, SimConfig, SimCounters, SimFabric, TapPoint, Verdict};
pub use tap::{Fate, Faults, Tap, TapHandle, Taps};

/// The environment variable that names the address of a UDP or shared-memory device whose
/// configuration gives none (else it takes the first free 127.0.0.x).
pub const ADDR_VAR: &str = "SOFTHCA_ADDR";

/// The address an OS-facing device takes, and what `open` made of it: the configured address,
/// else [`ADDR_VAR`] (parsed as `A`: the shm link takes IPv4 only, UDP any IP), else the
/// first 127.0.0.x that `open` does not find in use, so that several processes on one host
/// just work. `taken` is the error when every one is.
pub(crate) fn claim_address<A, T>(
    configured: Option<A>,
    loopback: impl Fn(std::net::Ipv4Addr) -> A,
    mut open: impl FnMut(A) -> std::io::Result<T>,
    taken: &str,
) -> std::io::Result<T>
where
    A: std::str::FromStr,
    A::Err: std::fmt::Display,
{
    use std::io::{Error, ErrorKind};
    let chosen = match (configured, std::env::var(ADDR_VAR)) {
        (Some(a), _) => Some(a),
        (None, Ok(s)) => Some(s.trim().parse::<A>().map_err(|e| {
            Error::new(ErrorKind::InvalidInput, format!("SOFTHCA_ADDR={s:?} is not a usable address: {e}"))
        })?),
        (None, Err(_)) => None,
    };
    if let Some(a) = chosen {
        return open(a);
    }
    for last in 1..=254u8 {
        match open(loopback(std::net::Ipv4Addr::new(127, 0, 0, last))) {
            Err(e) if e.kind() == ErrorKind::AddrInUse => continue,
            r => return r,
        }
    }
    Err(Error::new(ErrorKind::AddrInUse, taken.to_string()))
}
