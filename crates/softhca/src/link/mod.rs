//! Links: the drivers that own I/O and time and move datagrams between devices (DESIGN rule 1).
//!
//! - [`sim`]: a deterministic in-process fabric with a virtual clock and seeded faults.
//! - [`pcap`]: a tap that writes datagrams as Ethernet frames Wireshark can read.
//!
//! The UDP link (real sockets) is still to come.

pub mod pcap;
pub mod sim;
pub mod udp;

pub use pcap::{PcapTap, SharedBuf};
pub use sim::{DeviceId, FilterCtx, LinkConfig, SimConfig, SimCounters, SimFabric, TapPoint, Verdict};
