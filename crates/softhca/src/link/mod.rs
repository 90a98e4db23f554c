//! Links: the drivers that own I/O and time and move datagrams between devices (DESIGN rule 1).
//!
//! - [`sim`]: a deterministic in-process fabric with a virtual clock and seeded faults.
//! - [`udp`]: real UDP sockets on port 4791, one engine thread per device, batched I/O.
//! - [`shm`]: the same datagrams through rings in shared memory, for processes of one host.
//! - [`pcap`]: a capture that writes datagrams as Ethernet frames Wireshark can read.
//! - [`tap`]: middleware any link takes on its datagram path (a pcap capture, seeded faults).
//! - `driver`: the engine thread, doorbell and busy-poll turns any OS-facing link reuses
//!   through its `Port` (the UDP link's is `udp::port`); `os`: its eventfd and `ppoll`.
//!
//! A link drives devices from outside (`verbs::Context::receive`, `transmit`,
//! `handle_timeout`), so it is the top layer: it may import every layer below, and nothing
//! imports it.

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
