//! Taps on the UDP link (`link::tap`): seeded loss and duplication on both devices' arrivals,
//! as `tc netem` would add them to a real link but without privileges; and a capture as a tap.

mod udp_common;

use std::sync::atomic::Ordering::Relaxed;

use softhca::link::udp::UdpConfig;
use softhca::link::{Faults, PcapTap, SharedBuf, TapHandle};
use udp_common::*;

/// Sends, 200 KB Writes and Reads and atomics over real sockets with 3% of the datagrams each
/// device receives lost and 2% duplicated: every operation completes with Success and the data
/// read back equals what was written; the losses were real (the taps dropped datagrams and the
/// requesters went back for them), and the capture tap saw every datagram sent.
/// Rule PKT-RTY-1, PKT-NAK-1, PKT-DUP-1
#[test]
fn rc_traffic_survives_loss_and_duplication_on_the_udp_link() {
    let (fa, fb) = (Faults::new(21).loss(0.03).dup(0.02), Faults::new(22).loss(0.03).dup(0.02));
    let (ca, cb) = (fa.counts(), fb.counts());
    let capture = SharedBuf::new();
    let a =
        end(UdpConfig::default().tap(TapHandle::new(PcapTap::new(capture.clone()).unwrap())).tap(TapHandle::new(fa)));
    let b = end(UdpConfig::default().tap(TapHandle::new(fb)));
    traffic(&a, &b);
    let dropped = ca.dropped.load(Relaxed) + cb.dropped.load(Relaxed);
    let duplicated = ca.duplicated.load(Relaxed) + cb.duplicated.load(Relaxed);
    assert!(dropped > 0 && duplicated > 0, "{dropped} dropped, {duplicated} duplicated");
    let retries = a.dev.context().counters().retransmits + b.dev.context().counters().retransmits;
    assert!(retries > 0, "the requesters went back for what was lost");
    // The capture (pcap header, then one record per datagram) holds every datagram a sent and
    // every one that arrived for it, once its engine has stopped.
    let End { dev, .. } = a;
    let c = dev.close();
    let records = count_pcap_records(&capture.contents());
    assert_eq!(records as u64, c.tx_datagrams + c.rx_datagrams, "{c:?}");
}

fn count_pcap_records(pcap: &[u8]) -> usize {
    let mut at = 24;
    let mut n = 0;
    while at + 16 <= pcap.len() {
        let incl = u32::from_le_bytes(pcap[at + 8..at + 12].try_into().unwrap()) as usize;
        at += 16 + incl;
        n += 1;
    }
    assert_eq!(at, pcap.len(), "whole records");
    n
}
