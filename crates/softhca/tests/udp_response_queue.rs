//! The UDP link's response queue under a flood of requests: a requester whose device is
//! flooded with requests still sees its ACKs and read responses (they come in on a socket of
//! their own, read first), and the flood costs it nothing but the drops it counts. The unit
//! tests in `link/udp.rs` show the kernel side (a response gets past a full request queue);
//! this is the whole device.

mod udp_common;

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use softhca::link::udp::UdpConfig;
use softhca::*;
use udp_common::*;

/// Rule PKT-ACK-8: responses are matched to what the requester sent, whatever else arrives;
/// rule PKT-VAL-2: the flood's datagrams (bad ICRC) are dropped and counted.
#[test]
fn a_requester_flooded_with_requests_still_completes() {
    let (a, b) = (end(UdpConfig::default()), end(UdpConfig::default()));
    connect(&a.qp, b.dev.gid(), b.qp.qp_num(), Mtu::Mtu1024);
    connect(&b.qp, a.dev.gid(), a.qp.qp_num(), Mtu::Mtu1024);
    let to = SocketAddr::new(a.dev.addr(), 4791);
    let stop = Arc::new(AtomicBool::new(false));
    // Send Only requests with a bad ICRC, as fast as one thread sends them, until the
    // transfers below are done.
    let flood = {
        let stop = stop.clone();
        let from = UdpSocket::bind(SocketAddr::new(b.dev.addr(), 0)).unwrap();
        std::thread::spawn(move || {
            let mut d = [0x5Au8; 1100];
            d[0] = 0x04;
            let mut sent = 0u64;
            while !stop.load(Ordering::Relaxed) {
                sent += u64::from(from.send_to(&d, to).is_ok());
            }
            sent
        })
    };
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let n = 64 * 1024;
    let src = a.pd.reg_mr((0..n).map(|i| (i * 31) as u8).collect(), all).unwrap();
    let dst = b.pd.alloc_mr(n, all).unwrap();
    let back = a.pd.alloc_mr(n, all).unwrap();
    for round in 0..20u64 {
        a.qp.post_send(&[
            SendWr::rdma_write(round, &[src.sge(0..n)], dst.addr(), dst.rkey()).signaled(),
            SendWr::rdma_read(1000 + round, &[back.sge(0..n)], dst.addr(), dst.rkey()).signaled(),
        ])
        .unwrap();
        let w = wait(&a.cq, 2, 60);
        assert!(w.iter().all(|w| w.status == WcStatus::Success), "{w:?}");
    }
    stop.store(true, Ordering::Relaxed);
    let flooded = flood.join().unwrap();
    assert_eq!(back.to_vec().unwrap(), src.to_vec().unwrap());
    let c = a.dev.counters();
    // The flood reached the device and was dropped there; where it left a backlog, responses
    // were steered apart and read from their own queue.
    assert!(flooded > 0 && c.drop_bad_icrc + c.drop_malformed > 0, "{flooded} {c:?}");
    assert_eq!(c.steering_changes > 0, c.rx_response_queue > 0, "{c:?}");
}
