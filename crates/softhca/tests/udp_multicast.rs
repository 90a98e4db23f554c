//! UD multicast over the UDP link: a device hears a group through a socket bound to the group's
//! address and joined on its interface from the first attach to the last detach, and IP
//! multicast loops back, so devices on one host (and the sending QP itself) get each datagram,
//! its ICRC verified over the group address it was sent to.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use softhca::link::udp::{RxMode, UdpConfig, UdpDevice};
use softhca::*;

const MULTICAST_QPN: u32 = 0xFF_FFFF;
const QKEY: u32 = 0x0123_4567;

/// A UD QP at RTS with `n` receives of 256 bytes, on device `dev`; the device goes last.
struct End {
    qp: Qp,
    cq: Cq,
    mr: Mr,
    pd: Pd,
    dev: UdpDevice,
}

fn end(last: u8, mode: RxMode, busy_poll: bool) -> End {
    let addr = IpAddr::V4(Ipv4Addr::new(127, 31, 0, last));
    let dev = UdpDevice::open(UdpConfig::default().addr(addr).rx_mode(mode).busy_poll(busy_poll)).unwrap();
    let ctx = dev.context().clone();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let mr = pd.alloc_mr(256 * 16, Access::LOCAL_WRITE).unwrap();
    let qp = pd.create_qp(&QpInitAttr::ud(&cq, &cq).max_send_wr(16).max_recv_wr(16)).unwrap();
    qp.modify(&QpAttr::to_init().port(1).pkey_index(0).qkey(QKEY)).unwrap();
    qp.modify(&QpAttr::new(QpState::Rtr)).unwrap();
    qp.modify(&QpAttr::to_rts().sq_psn(0)).unwrap();
    for i in 0..16usize {
        qp.post_recv(&[RecvWr::new(i as u64, &[mr.sge(i * 256..(i + 1) * 256)])]).unwrap();
    }
    End { qp, cq, mr, pd, dev }
}

/// The next receive completion of `e`, which must come within 20 s.
fn next_recv(e: &End) -> Wc {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut wc = [Wc::default(); 1];
    loop {
        if e.cq.poll(&mut wc).unwrap() == 1 && wc[0].opcode == WcOpcode::Recv {
            return wc[0];
        }
        assert!(Instant::now() < deadline, "no multicast datagram arrived: {:#?}", e.dev.counters());
        std::thread::yield_now();
    }
}

fn group(last: u8) -> Gid {
    Gid::from_ipv4(Ipv4Addr::new(239, 31, 0, last))
}

/// Two devices, both QPs attached, one sending: both get the datagram (the sender's own device
/// through IP multicast loopback), the GRH area naming the group; a second group with only the
/// sender's device in it reaches that device only; after the last member of a group leaves,
/// its socket is gone, and a new attach hears the group again.
fn two_devices(mode: RxMode, busy_poll: bool, base: u8) {
    let a = end(base, mode, busy_poll);
    let b = end(base + 1, mode, busy_poll);
    for e in [&a, &b] {
        e.qp.attach_mcast(group(base), 0).unwrap();
    }
    let ah = a.pd.create_ah(&AhAttr::roce(group(base), 0)).unwrap();
    let src = a.pd.reg_mr(b"hello, group".to_vec(), Access::LOCAL_WRITE).unwrap();
    let send = |id| a.qp.post_send(&[SendWr::send(id, &[src.sge(0..12)]).ud(&ah, MULTICAST_QPN, QKEY).imm(7)]).unwrap();
    send(1);
    for e in [&a, &b] {
        let w = next_recv(e);
        assert_eq!((w.status, w.src_qp, w.byte_len, w.imm()), (WcStatus::Success, a.qp.qp_num(), 52, Some(7)));
        let got = e.mr.to_vec().unwrap();
        let at = 256 * w.wr_id as usize;
        assert_eq!(&got[at + 20 + 12..at + 20 + 16], &[127, 31, 0, base], "the source: a's address");
        assert_eq!(&got[at + 20 + 16..at + 20 + 20], &[239, 31, 0, base], "the destination: the group");
        assert_eq!(&got[at + 40..at + 52], b"hello, group");
    }
    assert!(b.dev.counters().drop_bad_icrc == 0);

    b.qp.detach_mcast(group(base), 0).unwrap();
    b.qp.attach_mcast(group(base), 0).unwrap();
    send(2);
    assert_eq!(next_recv(&b).src_qp, a.qp.qp_num(), "the group heard again after a new attach");
    assert_eq!(next_recv(&a).src_qp, a.qp.qp_num());
}

#[test]
fn a_group_reaches_both_devices_blocking() {
    two_devices(RxMode::Socket, false, 1);
}

#[test]
fn a_group_reaches_both_devices_busy_polled() {
    two_devices(RxMode::Socket, true, 3);
}

/// With the raw receive socket (root), which sees only datagrams to the device's address: a
/// group still comes through its own socket.
#[test]
fn a_group_reaches_both_devices_with_raw_receive() {
    two_devices(RxMode::Auto, false, 5);
}

/// A group's last member leaving (its socket closed) while the engine thread delivers what
/// that socket brought: the detach holds the device's group table and then the link's list of
/// group sockets, and delivery takes the table, so the engine must not hold the list while it
/// delivers. It did, and the two threads waited for each other for ever (Debian's mckey
/// against Linux rxe, sender side: a full member leaving while its own datagrams came back).
/// Hang guard: 60 s.
#[test]
fn a_member_leaves_while_its_group_is_delivered() {
    let a = end(7, RxMode::Socket, false);
    let b = end(8, RxMode::Socket, false);
    let ah = a.pd.create_ah(&AhAttr::roce(group(7), 0)).unwrap();
    let src = a.pd.reg_mr(vec![7u8; 64], Access::LOCAL_WRITE).unwrap();
    let sge = [src.sge(0..64)];
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let guard = {
        let done = done.clone();
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(60);
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                if Instant::now() > deadline {
                    eprintln!("a_member_leaves_while_its_group_is_delivered: HANG");
                    std::process::abort();
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let mut wc = [Wc::default(); 16];
    for round in 0..1000u64 {
        b.qp.attach_mcast(group(7), 0).unwrap();
        for i in 0..8 {
            // Unsignaled: a WQE leaves the SQ once its datagram is out.
            let wr = SendWr::send(round * 8 + i, &sge).ud(&ah, MULTICAST_QPN, QKEY);
            while let Err(e) = a.qp.post_send(std::slice::from_ref(&wr)) {
                assert_eq!(e.error, VerbsError::QueueFull);
                std::thread::yield_now();
            }
        }
        b.qp.detach_mcast(group(7), 0).unwrap();
        // Keep b's receive queue stocked and a's completions drained.
        while let Ok(n @ 1..) = b.cq.poll(&mut wc) {
            for w in &wc[..n] {
                let i = w.wr_id as usize;
                b.qp.post_recv(&[RecvWr::new(w.wr_id, &[b.mr.sge(i * 256..(i + 1) * 256)])]).unwrap();
            }
        }
        while let Ok(1..) = a.cq.poll(&mut wc) {}
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    guard.join().unwrap();
}
