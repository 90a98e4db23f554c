//! Fuzzes the inbound path: a transport packet (BTH … ICRC), an IP datagram
//! and an Ethernet frame. Nothing may panic (DESIGN rule 2), and whatever
//! parses must survive emit → parse unchanged.

#![no_main]

use libfuzzer_sys::fuzz_target;
use softhca::wire::{roce, PacketRepr};

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = PacketRepr::parse_bytes(data) {
        // PadCnt is implied by the payload length of an accepted packet, so
        // the re-emitted packet parses to the same repr.
        let mut buf = vec![0u8; p.buffer_len()];
        let n = p.emit(&mut buf).expect("a parsed packet re-emits");
        assert_eq!(n, data.len());
        assert_eq!(PacketRepr::parse_bytes(&buf[..n]), Ok(p));
    }
    if let Ok(d) = roce::parse_ip_unverified(data) {
        let repr = d.to_repr();
        let mut buf = vec![0u8; repr.buffer_len()];
        let n = repr.emit(&mut buf).expect("a parsed datagram re-emits");
        let again = roce::parse_ip(&buf[..n]).expect("a re-emitted datagram verifies");
        assert_eq!(again.packet, d.packet);
    }
    let _ = roce::parse_ethernet(data);
});
