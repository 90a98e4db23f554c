//! Raw Ethertype QPs over the UDP link: whole Ethernet frames through an AF_PACKET socket on
//! the interface of the device's address (loopback here), where the process may open one.
//! Where it may not, the device has no Raw Ethertype QPs and Create QP says so.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use softhca::link::udp::{UdpConfig, UdpDevice};
use softhca::*;

const LOCAL_EXPERIMENTAL: u16 = 0x88B5;

/// A Raw Ethertype QP at RTS with 8 receives posted, its buffer, on its own device (the QP
/// and the region hold their PD; the device goes last).
struct End {
    qp: Qp,
    cq: Cq,
    mr: Mr,
    dev: UdpDevice,
}

/// `None` where the process has no packet socket (the refusal checked).
fn end(last: u8) -> Option<End> {
    let dev = UdpDevice::open(UdpConfig::default().addr(IpAddr::V4(Ipv4Addr::new(127, 23, 0, last)))).unwrap();
    let ctx = dev.context().clone();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let mr = pd.alloc_mr(64 * 1024, Access::LOCAL_WRITE).unwrap();
    let qp = match pd.create_qp(&QpInitAttr::new(QpType::RawEthertype, &cq, &cq)) {
        Ok(qp) => qp,
        Err(e) => {
            // No AF_PACKET socket for this process: said at Create QP, and the device shows
            // no frame MAC and no Raw Ethertype QPs.
            assert!(matches!(e, VerbsError::InvalidServiceType(_)), "{e:?}");
            assert_eq!((dev.mac(), ctx.query_device().unwrap().max_raw_ethy_qp), (None, 0));
            eprintln!("udp_raw: no AF_PACKET socket here (needs CAP_NET_RAW); the refusal was checked");
            return None;
        }
    };
    qp.modify(&QpAttr::to_init().port(1)).unwrap();
    qp.modify(&QpAttr::new(QpState::Rtr)).unwrap();
    qp.modify(&QpAttr::to_rts()).unwrap();
    for i in 0..8u64 {
        let at = 32 * 1024 + i as usize * 2048;
        qp.post_recv(&[RecvWr::new(100 + i, &[mr.sge(at..at + 2048)])]).unwrap();
    }
    Some(End { qp, cq, mr, dev })
}

/// The first `n` completions of `e`'s CQ; on a timeout the message shows the device's counters
/// (whether the packet left or arrived).
fn wait(e: &End, n: usize) -> Vec<Wc> {
    let cq = &e.cq;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut out = Vec::new();
    let mut wcs = [Wc::default(); 16];
    while out.len() < n {
        let k = cq.poll(&mut wcs).unwrap();
        out.extend_from_slice(&wcs[..k]);
        assert!(Instant::now() < deadline, "timed out: {out:?}\n{:#?}", e.dev.counters());
        std::thread::yield_now();
    }
    out
}

fn frame(dst: [u8; 6], src: [u8; 6], payload: &[u8]) -> Vec<u8> {
    [&dst[..], &src[..], &LOCAL_EXPERIMENTAL.to_be_bytes()[..], payload].concat()
}

fn send(e: &End, wr_id: u64, bytes: &[u8]) {
    let at = wr_id as usize * 2048;
    e.mr.write(at, bytes).unwrap();
    e.qp.post_send(&[SendWr::send(wr_id, &[e.mr.sge(at..at + bytes.len())]).signaled()]).unwrap();
}

fn received(e: &End, wc: &Wc) -> Vec<u8> {
    let mut out = vec![0u8; wc.byte_len as usize];
    e.mr.read(32 * 1024 + (wc.wr_id - 100) as usize * 2048, &mut out).unwrap();
    out
}

/// A frame to the peer's MAC and a broadcast arrive whole in the peer's Raw Ethertype QP;
/// the sender hears neither back (loopback shows every socket every frame: the link filters
/// by MAC as a NIC would); the RoCE traffic on the same interface never reaches a Raw QP.
#[test]
fn frames_cross_the_interface_whole() {
    let (Some(a), Some(b)) = (end(1), end(2)) else { return };
    let (ma, mb) = (a.dev.mac().unwrap(), b.dev.mac().unwrap());
    assert_ne!(ma, mb);
    let unicast = frame(mb, ma, b"over a packet socket");
    let broadcast = frame([0xff; 6], ma, &[9u8; 1200]);
    send(&a, 1, &unicast);
    send(&a, 2, &broadcast);
    let wa: Vec<_> = wait(&a, 2).iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(wa, vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
    let wb = wait(&b, 2);
    for (wc, want) in wb.iter().zip([&unicast, &broadcast]) {
        assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::Recv));
        assert_eq!(&received(&b, wc), want);
    }
    let c = b.dev.counters();
    assert_eq!(c.rx_raw_packets, 2);
    assert_eq!(a.dev.counters().tx_raw_packets, 2);
    // Nothing came back to the sender, and nothing else reached either raw QP.
    let mut wcs = [Wc::default(); 4];
    assert_eq!(a.cq.poll(&mut wcs).unwrap(), 0);
    assert_eq!(b.cq.poll(&mut wcs).unwrap(), 0);
}

/// Raw IPv6 QPs between two IPv6 devices: an IPv6 datagram (next header 253, experimentation)
/// sent by one arrives whole at the other, through the kernel's routing on the way out and a
/// packet socket filtered to the device's address (and to what is not RoCE) on the way in.
/// The two addresses live on the loopback of a network
/// namespace of the test's own thread (root); where namespaces are refused, an IPv6 device
/// without the privilege has no Raw IPv6 QPs, and that is what is checked.
#[test]
fn ipv6_datagrams_cross_between_two_addresses() {
    std::thread::spawn(ipv6_in_a_namespace).join().unwrap();
}

fn ipv6_in_a_namespace() {
    // SAFETY: unshare takes no pointers; it moves this thread (and what it spawns) to a new
    // network namespace.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        // No second address to reach: what an IPv6 device on ::1 offers is consistent with
        // what Create QP does (a Raw IPv6 QP where the device has a packet socket for them,
        // a refusal where it has none).
        let dev = match UdpDevice::open(UdpConfig::default().addr("::1".parse::<IpAddr>().unwrap())) {
            Ok(dev) => dev,
            Err(e) => {
                assert_eq!(e.kind(), std::io::ErrorKind::AddrNotAvailable, "{e}");
                eprintln!("udp_raw: no IPv6 here: {e}");
                return;
            }
        };
        let ctx = dev.context();
        let max = ctx.query_device().unwrap().max_raw_ipv6_qp;
        let (pd, cq) = (ctx.alloc_pd().unwrap(), ctx.create_cq(4).unwrap());
        let created = pd.create_qp(&QpInitAttr::new(QpType::RawIpv6, &cq, &cq));
        assert_eq!(created.is_ok(), max > 0, "{created:?}");
        eprintln!("udp_raw: no network namespace here (needs root); Create QP checked against the device");
        return;
    }
    let ip = |args: &[&str]| {
        let out = std::process::Command::new("ip").args(args).output().expect("ip");
        assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    ip(&["link", "set", "lo", "up"]);
    let (a6, b6): (IpAddr, IpAddr) = ("fd00:5ca::1".parse().unwrap(), "fd00:5ca::2".parse().unwrap());
    for a in [a6, b6] {
        ip(&["-6", "addr", "add", &format!("{a}/128"), "dev", "lo", "nodad"]);
    }
    let end6 = |addr: IpAddr| {
        let dev = UdpDevice::open(UdpConfig::default().addr(addr)).unwrap();
        assert!(dev.context().query_device().unwrap().max_raw_ipv6_qp > 0);
        let ctx = dev.context().clone();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64).unwrap();
        let mr = pd.alloc_mr(64 * 1024, Access::LOCAL_WRITE).unwrap();
        let qp = pd.create_qp(&QpInitAttr::new(QpType::RawIpv6, &cq, &cq)).unwrap();
        qp.modify(&QpAttr::to_init().port(1)).unwrap();
        qp.post_recv(&[RecvWr::new(100, &[mr.sge(32 * 1024..34 * 1024)])]).unwrap();
        qp.modify(&QpAttr::new(QpState::Rtr)).unwrap();
        qp.modify(&QpAttr::to_rts()).unwrap();
        End { qp, cq, mr, dev }
    };
    let (a, b) = (end6(a6), end6(b6));
    let (IpAddr::V6(src), IpAddr::V6(dst)) = (a6, b6) else { unreachable!() };
    let payload = b"an IPv6 datagram with no transport header softhca knows";
    let mut d = vec![0x60, 0, 0, 0];
    d.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    d.extend_from_slice(&[253, 64]);
    d.extend_from_slice(&src.octets());
    d.extend_from_slice(&dst.octets());
    d.extend_from_slice(payload);
    send(&a, 1, &d);
    assert_eq!(wait(&a, 1)[0].status, WcStatus::Success);
    let wb = wait(&b, 1);
    assert_eq!((wb[0].status, wb[0].opcode, wb[0].byte_len as usize), (WcStatus::Success, WcOpcode::Recv, d.len()));
    assert_eq!(received(&b, &wb[0]), d);
    assert_eq!((a.dev.counters().tx_raw_packets, b.dev.counters().rx_raw_packets), (1, 1));
}
