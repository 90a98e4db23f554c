//! UD multicast over the UDP link: a device hears a group through a socket bound to the group's
//! address and joined on its interface from the first attach to the last detach, and IP
//! multicast loops back, so devices on one host (and the sending QP itself) get each datagram,
//! its ICRC verified over the group address it was sent to.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use softhca::link::udp::{RxMode, UdpConfig, UdpDevice};
use softhca::*;

mod udp_common;

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
    end_on(UdpConfig::default().addr(addr).rx_mode(mode).busy_poll(busy_poll), 16)
}

/// [`end`] on a device of `cfg`, with `recvs` receives posted.
fn end_on(cfg: UdpConfig, recvs: usize) -> End {
    let dev = UdpDevice::open(cfg).unwrap();
    let ctx = dev.context().clone();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let mr = pd.alloc_mr(256 * 16, Access::LOCAL_WRITE).unwrap();
    let qp = pd.create_qp(&QpInitAttr::ud(&cq, &cq).max_send_wr(16).max_recv_wr(16)).unwrap();
    qp.modify(&QpAttr::to_init().port(1).pkey_index(0).qkey(QKEY)).unwrap();
    qp.modify(&QpAttr::new(QpState::Rtr)).unwrap();
    qp.modify(&QpAttr::to_rts().sq_psn(0)).unwrap();
    for i in 0..recvs {
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

/// Two devices of one host on two interfaces (the ends of a veth pair in a network namespace
/// of the test's own thread: root; where namespaces are refused it says so and passes), an
/// IPv4 group and an IPv6 one (an `ff0e::` MGID, joined with `IPV6_ADD_MEMBERSHIP`): both
/// devices' QPs get each Send, and once: the sender's own device hears the looped-back copy,
/// not also the one that came back over the wire, and the other only the wire's.
#[test]
fn a_group_over_two_interfaces_reaches_each_device_once() {
    for v6 in [false, true] {
        std::thread::spawn(move || group_over_veth(v6)).join().unwrap();
    }
}

fn group_over_veth(v6: bool) {
    // SAFETY: unshare takes no pointers; it moves this thread (and what it spawns: the `ip`
    // commands, the engine threads) to a new network namespace.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        eprintln!("udp_multicast: no network namespace here (needs root): two interfaces not tried");
        return;
    }
    let ip = |args: &[&str]| udp_common::netns::ip(args).unwrap();
    ip(&["link", "set", "lo", "up"]);
    ip(&["link", "add", "mca", "type", "veth", "peer", "name", "mcb"]);
    let (addrs, prefix, group): ([IpAddr; 2], &str, Gid) = if v6 {
        (
            ["fd00:5ca::11".parse().unwrap(), "fd00:5ca::12".parse().unwrap()],
            "64",
            Gid(*b"\xff\x0e\0\0\0\0\0\0\0\0\0\0\0\x01\x02\x03"),
        )
    } else {
        (["198.19.0.11".parse().unwrap(), "198.19.0.12".parse().unwrap()], "24", group(99))
    };
    for (a, dev) in addrs.iter().zip(["mca", "mcb"]) {
        let family = if v6 { "-6" } else { "-4" };
        let mut args = vec![family, "addr", "add"];
        let spec = format!("{a}/{prefix}");
        args.extend([spec.as_str(), "dev", dev]);
        if v6 {
            args.push("nodad");
        }
        ip(&args);
        ip(&["link", "set", dev, "mtu", "9000", "up"]);
    }
    if !v6 {
        // Both ends are this host's: IPv4 drops a datagram from one of its own addresses that
        // arrives over an interface, unless told to take it.
        for dev in ["all", "mca", "mcb"] {
            let knob = format!("/proc/sys/net/ipv4/conf/{dev}/accept_local");
            std::fs::write(&knob, "1").unwrap_or_else(|e| panic!("{knob}: {e}"));
        }
    }
    for dev in ["mca", "mcb"] {
        udp_common::netns::wait_until_carrying(None, dev).unwrap();
    }
    let (a, b) = (end_on(UdpConfig::default().addr(addrs[0]), 2), end_on(UdpConfig::default().addr(addrs[1]), 2));
    for e in [&a, &b] {
        e.qp.attach_mcast(group, 0).unwrap();
    }
    let ah = a.pd.create_ah(&AhAttr::roce(group, 0)).unwrap();
    let src = a.pd.reg_mr(b"hello, the group".to_vec(), Access::LOCAL_WRITE).unwrap();
    for id in 1..=2 {
        a.qp.post_send(&[SendWr::send(id, &[src.sge(0..16)]).ud(&ah, MULTICAST_QPN, QKEY)]).unwrap();
        for e in [&a, &b] {
            let w = next_recv(e);
            assert_eq!((w.status, w.src_qp, w.byte_len), (WcStatus::Success, a.qp.qp_num(), 56));
            let got = e.mr.to_vec().unwrap();
            let at = 256 * w.wr_id as usize;
            let dst = if v6 { &got[at + 24..at + 40] } else { &got[at + 36..at + 40] };
            assert_eq!(dst, if v6 { &group.0[..] } else { &group.0[12..] }, "the destination: the group");
            assert_eq!(&got[at + 40..at + 56], b"hello, the group");
        }
    }
    for e in [&a, &b] {
        assert_eq!(e.dev.counters().rx_datagrams, 2, "one copy of each Send");
    }
}

/// Rule PKT-ROCE-3: a multicast datagram leaves the UDP link with the address handle's hop
/// limit and Traffic Class (a socket's own multicast TTL is 1, and it would have sent that), as
/// a plain socket joined to the group reads them (`IP_RECVTTL`, `IP_RECVTOS`).
#[test]
fn a_multicast_datagram_carries_the_address_handles_hop_limit() {
    let grp = Ipv4Addr::new(239, 31, 0, 41);
    let a = end(41, RxMode::Socket, false);
    let plain = std::net::UdpSocket::bind((grp, 4791)).unwrap();
    plain.join_multicast_v4(&grp, &Ipv4Addr::new(127, 31, 0, 41)).unwrap();
    plain.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    softhca::link::udp::sys::report_ip_fields(std::os::fd::AsRawFd::as_raw_fd(&plain), false, true).unwrap();
    let mut attr = AhAttr::roce(Gid::from_ipv4(grp), 0);
    attr.grh.hop_limit = Some(5);
    attr.grh.traffic_class = Some(0x28);
    let ah = a.pd.create_ah(&attr).unwrap();
    let src = a.pd.reg_mr(b"hello, group".to_vec(), Access::LOCAL_WRITE).unwrap();
    a.qp.post_send(&[SendWr::send(1, &[src.sge(0..12)]).ud(&ah, MULTICAST_QPN, QKEY)]).unwrap();
    let r = udp_common::plain::recv(&plain).expect("the datagram");
    // BTH, DETH, payload, ICRC.
    assert_eq!((r.len, r.ttl, r.tos), (12 + 8 + 12 + 4, Some(5), Some(0x28)));
}
