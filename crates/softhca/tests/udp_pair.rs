//! Two UDP devices in one process on 127.0.0.x: RC Send/Receive, RDMA Write, RDMA Read and
//! both atomics over real sockets, in blocking and busy-poll mode.

mod udp_common;

use softhca::link::udp::{RxMode, UdpConfig};
use softhca::*;
use udp_common::*;

/// Taken by the tests that check what a poller's turns send together (answers with their
/// ACKs) and by every test whose devices busy-poll or whose round trips load both cores: run
/// side by side (cargo runs a binary's tests two at a time), a round trip or another test's
/// busy-polling engine threads kept the poller of the first from its core between a Send's
/// arrival and its answer, and the engine thread sent the ACK alone, as it must once the
/// poller has stopped.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn round_trip(cfg: impl Fn() -> UdpConfig, mtu: Mtu) {
    let _one = one_at_a_time();
    let a = end(cfg());
    let b = end(cfg());
    assert_ne!(a.dev.addr(), b.dev.addr());
    assert_eq!(a.dev.context().query_gid(1, 0).unwrap(), a.dev.gid());
    connect(&a.qp, b.dev.gid(), b.qp.qp_num(), mtu);
    connect(&b.qp, a.dev.gid(), a.qp.qp_num(), mtu);

    let n = 100_000usize;
    let src = a.pd.reg_mr((0..n).map(|i| (i * 7) as u8).collect(), Access::LOCAL_WRITE).unwrap();
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let dst = b.pd.alloc_mr(n, all).unwrap();

    // Send with immediate into a posted receive.
    b.qp.post_recv(&[RecvWr::new(7, &[dst.sge(0..n)])]).unwrap();
    a.qp.post_send(&[SendWr::send(1, &[src.sge(0..30_000)]).signaled().imm(0xabcd)]).unwrap();
    let wa = wait(&a.cq, 1, 10);
    let wb = wait(&b.cq, 1, 10);
    assert_eq!(wa[0].status, WcStatus::Success, "{wa:?}");
    assert_eq!((wb[0].status, wb[0].byte_len, wb[0].imm()), (WcStatus::Success, 30_000, Some(0xabcd)));
    assert_eq!(dst.to_vec().unwrap()[..30_000], src.to_vec().unwrap()[..30_000]);

    // RDMA Write the whole buffer, then read it back.
    a.qp.post_send(&[SendWr::rdma_write(2, &[src.sge(0..n)], dst.addr(), dst.rkey()).signaled()]).unwrap();
    assert_eq!(wait(&a.cq, 1, 10)[0].status, WcStatus::Success);
    assert_eq!(dst.to_vec().unwrap(), src.to_vec().unwrap());
    let back = a.pd.alloc_mr(n, Access::LOCAL_WRITE).unwrap();
    a.qp.post_send(&[SendWr::rdma_read(3, &[back.sge(0..n)], dst.addr(), dst.rkey()).signaled()]).unwrap();
    let w = wait(&a.cq, 1, 10);
    assert_eq!((w[0].status, w[0].opcode, w[0].byte_len), (WcStatus::Success, WcOpcode::RdmaRead, n as u32));
    assert_eq!(back.to_vec().unwrap(), src.to_vec().unwrap());

    // Atomics on dst[8..16].
    dst.write(8, &40u64.to_ne_bytes()).unwrap();
    let res = a.pd.alloc_mr(16, Access::LOCAL_WRITE).unwrap();
    a.qp.post_send(&[
        SendWr::atomic_fetch_add(4, &[res.sge(0..8)], dst.addr() + 8, dst.rkey(), 2).signaled(),
        SendWr::atomic_cmp_swp(5, &[res.sge(8..16)], dst.addr() + 8, dst.rkey(), 42, 7).signaled(),
    ])
    .unwrap();
    let w = wait(&a.cq, 2, 10);
    assert!(w.iter().all(|w| w.status == WcStatus::Success), "{w:?}");
    let mut r = [0u8; 16];
    res.read(0, &mut r).unwrap();
    assert_eq!(u64::from_ne_bytes(r[..8].try_into().unwrap()), 40);
    assert_eq!(u64::from_ne_bytes(r[8..].try_into().unwrap()), 42);
    let mut v = [0u8; 8];
    dst.read(8, &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v), 7);

    // Nothing was dropped on the way.
    for d in [&a.dev, &b.dev] {
        let c = d.counters();
        assert_eq!((c.drop_bad_icrc, c.drop_malformed, c.tx_errors), (0, 0, 0), "{c:?}");
        assert!(c.rx_datagrams > 0 && c.tx_datagrams > 0, "{c:?}");
        assert_eq!(d.context().counters().rx_bad_icrc, 0);
    }
}

#[test]
fn rc_round_trip_blocking() {
    round_trip(UdpConfig::default, Mtu::Mtu4096);
}

#[test]
fn rc_round_trip_busy_poll_mtu1024() {
    round_trip(|| UdpConfig::default().busy_poll(true), Mtu::Mtu1024);
}

#[test]
fn rc_round_trip_without_offloads() {
    round_trip(|| UdpConfig::default().gso(false).gro(false), Mtu::Mtu4096);
}

/// The privileged receive path (raw socket, exact IPv4 ICRC). Skips when raw sockets are
/// refused (not root / no CAP_NET_RAW).
#[test]
fn rc_round_trip_raw_rx() {
    if let Err(e) = softhca::link::udp::UdpDevice::open(UdpConfig::default().rx_mode(RxMode::Raw)) {
        eprintln!("SKIP rc_round_trip_raw_rx: raw sockets refused here ({e})");
        return;
    }
    round_trip(|| UdpConfig::default().rx_mode(RxMode::Raw), Mtu::Mtu4096);
}

/// Waits (sleeping, never polling a CQ) until `cond` holds; panics after `secs` seconds with
/// `what`, which is made only then (it may poll, to say what did happen).
fn wait_without_polling(secs: u64, what: impl FnOnce() -> String, cond: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while !cond() {
        if std::time::Instant::now() >= deadline {
            panic!("timed out waiting for {}", what());
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Busy-poll mode with nobody polling: the engine thread stands in for the poller, both
/// before any poll and after the application stops polling: inbound writes land, ACKs are
/// received, completions are made, all without a Poll for Completion.
#[test]
fn busy_poll_progresses_without_a_poller() {
    let _one = one_at_a_time();
    let a = end(UdpConfig::default().busy_poll(true));
    let b = end(UdpConfig::default().busy_poll(true));
    assert!(a.dev.busy_poll());
    connect(&a.qp, b.dev.gid(), b.qp.qp_num(), Mtu::Mtu4096);
    connect(&b.qp, a.dev.gid(), a.qp.qp_num(), Mtu::Mtu4096);
    let n = 200_000usize;
    let src = a.pd.reg_mr((0..n).map(|i| (i * 11) as u8).collect(), Access::LOCAL_WRITE).unwrap();
    let dst = b.pd.alloc_mr(n, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    for round in 0..2u8 {
        if round == 1 {
            // Poll for a while (the application drives the engine inline), then stop.
            for _ in 0..1000 {
                assert_eq!(a.cq.poll(&mut [Wc::default(); 4]).unwrap(), 0);
                assert_eq!(b.cq.poll(&mut [Wc::default(); 4]).unwrap(), 0);
            }
        }
        let before = a.dev.context().counters();
        let first = round * 7 + 1;
        src.write(0, &[first; 64]).unwrap();
        a.qp.post_send(&[SendWr::rdma_write(u64::from(round), &[src.sge(0..n)], dst.addr(), dst.rkey()).signaled()])
            .unwrap();
        wait_without_polling(
            20,
            || "the write to land".into(),
            || {
                let v = dst.to_vec().unwrap();
                v[0] == first && v[n - 1] == src.to_vec().unwrap()[n - 1]
            },
        );
        // The requester hears ACKs without being polled.
        wait_without_polling(20, || "an ACK".into(), || (a.dev.context().counters() - before).rx_packets >= 1);
        let w = wait(&a.cq, 1, 20);
        assert_eq!((w[0].status, w[0].wr_id), (WcStatus::Success, u64::from(round)), "{w:?}");
        assert_eq!(dst.to_vec().unwrap(), src.to_vec().unwrap());
    }
}

/// Busy-poll mode, nobody polling, a peer that never answers: the ACK timer still runs out
/// and the retries are spent on the engine thread, so the Send fails with a retry error.
#[test]
fn busy_poll_timers_run_without_a_poller() {
    let _one = one_at_a_time();
    // Port 4791 of a loopback address held by a plain socket that never reads: datagrams
    // sent there vanish and nothing comes back, and no device of a test running beside this
    // one can take the address (the datagrams go to port 4791 of the GID's address, so a hole
    // on another port of an address a device holds would be that device).
    let (hole, ip) = (2..=254u8)
        .rev()
        .map(|x| std::net::Ipv4Addr::new(127, 0, 0, x))
        .find_map(|ip| std::net::UdpSocket::bind((ip, 4791)).ok().map(|s| (s, ip)))
        .expect("a free 127.0.0.x:4791");
    let a = end(UdpConfig::default().busy_poll(true));
    let gid = Gid::from_ipv4(ip);
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let av = AddressVector::new(AhAttr::roce(gid, 0), Mtu::Mtu1024);
    a.qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(all)).unwrap();
    a.qp.modify(&QpAttr::to_rtr(av, 0x123).rq_psn(0).max_dest_rd_atomic(1).min_rnr_timer(1)).unwrap();
    // timeout 8: 4.096 us * 2^8 ≈ 1 ms per try, 1 + 2 tries.
    a.qp.modify(&QpAttr::to_rts().sq_psn(0).timeout(8).retry_cnt(2).rnr_retry(0).max_rd_atomic(1)).unwrap();
    let buf = a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    a.qp.post_send(&[SendWr::send(5, &[buf.sge(0..64)]).signaled()]).unwrap();
    let what = || {
        // Only now may the CQ be polled: what completed, and how.
        let mut w = [Wc::default(); 4];
        let n = a.cq.poll(&mut w).unwrap();
        format!("3 timeouts: {:?}; {:?}; {:?}", &w[..n], a.dev.context().counters(), a.dev.counters())
    };
    wait_without_polling(20, what, || a.dev.context().counters().timeouts >= 3);
    let w = wait(&a.cq, 1, 20);
    assert_eq!((w[0].wr_id, w[0].status), (5, WcStatus::RetryExcErr), "{w:?}");
    drop(hole);
}

/// Rule PKT-ROCE-10, PKT-ACK-3: a ping-pong of 8-byte Sends between busy-polled devices, each
/// answer posted on seeing the message it answers. An answer and the ACK owed for that message
/// leave in one GSO message (the ACK the shorter last segment), the peer takes both datagrams
/// in at once, checks both ICRCs and completes its Send from the ACK.
#[test]
fn an_answer_and_its_ack_leave_as_one_gso_message() {
    answers_carry_their_acks(true, 0);
}

/// Rule PKT-ROCE-10, PKT-ACK-3: the same between devices in the default blocking mode whose
/// application spins on its CQ (as perftest and the pingpongs do): its polls drive the engine
/// as busy-poll's do, and the ACK waits for the answer the same way.
#[test]
fn a_spinning_poller_in_blocking_mode_sends_answer_and_ack_together() {
    answers_carry_their_acks(false, 0);
}

/// Rule PKT-ACK-3, PKT-ACK-13: the same when the application polls again, and finds nothing,
/// between the completion and its answer (it drains its CQ, or polls its send CQ, as softhca
/// perf and perftest do): the flush at the head of that poll left the ACK alone, one more
/// system call a round trip, where the answer posted next would have taken it along.
#[test]
fn a_poll_that_finds_nothing_before_the_answer_leaves_the_ack_for_it() {
    for busy_poll in [true, false] {
        answers_carry_their_acks(busy_poll, 1);
    }
}

fn answers_carry_their_acks(busy_poll: bool, empty_polls: usize) {
    let _one = one_at_a_time();
    let cfg = || UdpConfig::default().busy_poll(busy_poll);
    let (a, b) = (end(cfg()), end(cfg()));
    connect(&a.qp, b.dev.gid(), b.qp.qp_num(), Mtu::Mtu1024);
    connect(&b.qp, a.dev.gid(), a.qp.qp_num(), Mtu::Mtu1024);
    let (ma, mb) = (a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap(), b.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap());
    let rounds = 200u64;
    for i in 0..rounds {
        b.qp.post_recv(&[RecvWr::new(i, &[mb.sge(0..8)])]).unwrap();
        a.qp.post_recv(&[RecvWr::new(i, &[ma.sge(8..16)])]).unwrap();
        ma.write(0, &i.to_le_bytes()).unwrap();
        a.qp.post_send(&[SendWr::send(i, &[ma.sge(0..8)]).signaled()]).unwrap();
        let got = wait(&b.cq, 1, 10);
        assert_eq!((got[0].status, got[0].opcode), (WcStatus::Success, WcOpcode::Recv), "{got:?}");
        for _ in 0..empty_polls {
            let mut none = [Wc::default(); 4];
            assert_eq!(b.cq.poll(&mut none).unwrap(), 0);
        }
        mb.write(8, &(!i).to_le_bytes()).unwrap();
        b.qp.post_send(&[SendWr::send(i, &[mb.sge(8..16)]).signaled()]).unwrap();
        // A's Send completion (B's ACK) and B's answer, in either order.
        let wa = wait(&a.cq, 2, 10);
        assert!(wa.iter().all(|w| w.status == WcStatus::Success), "{wa:?}");
        assert_eq!(ma.to_vec().unwrap()[8..16], (!i).to_le_bytes());
        let wb = wait(&b.cq, 1, 10);
        assert_eq!(wb[0].status, WcStatus::Success, "{wb:?}");
    }
    let (ca, cb) = (a.dev.counters(), b.dev.counters());
    for c in [&ca, &cb] {
        assert_eq!((c.drop_bad_icrc, c.drop_malformed, c.tx_errors), (0, 0, 0), "{c:?}");
    }
    // B sends nothing but 8-byte answers and ACKs (a QP's ACKs coalesce): a GSO message of
    // B's is an answer with its ACK. Most rounds give one; timing may split a few.
    //
    // What is checked is what a poller's turns do, so in blocking mode only when B's polls
    // drove B: on two cores busy with other tests the test thread's polls (it yields after
    // each empty one) can come too far apart to count as spinning, B's engine thread then
    // takes every Send in from `ppoll` (twice a round: `sleeps` near 2 x rounds) and sends
    // its ACK at once, as it must. Measured: an idle machine, `sleeps` 0-8 and 200 answers of
    // 200 with their ACK; under load, `sleeps` 340-415 and 0-41 of them, the build before
    // this test's last change as this one (CI failed once so, 2026-11-28); in between,
    // roughly 200 - sleeps / 2. A broken hold gives none with the poller driving. Under two
    // CPU hogs beside the suite (2026-11-30) B's polls drove no turn at all (`poller_turns` 0)
    // while its engine thread, never idle long, slept only 26 and 134 times: so the count of
    // the turns B's polls ran says who drove, with `sleeps` beside it. (Under those two hogs
    // even a driving poller, taken off its core between a Send and its answer, left a third
    // of the rounds' ACKs or more to the engine thread, as it must; nothing here tells those
    // rounds apart, so that load is beyond this test.)
    if busy_poll || (cb.sleeps < rounds && cb.poller_turns >= rounds) {
        assert!(cb.tx_gso_messages >= rounds / 4, "{cb:?}");
    } else {
        eprintln!("B's engine thread took the traffic (polls too far apart): {cb:?}");
    }
    assert_eq!(cb.tx_gso_segments, 2 * cb.tx_gso_messages, "{cb:?}");
}

/// Rule PKT-ACK-3, PKT-ACK-13: an ACK a spinning poller's turn left for its next poll is not
/// overtaken by what the application sends next from another QP once it stops polling (a
/// disconnect's DREQ from QP1 answering the last completion; here a UD Send): the engine
/// thread flushes them in the order the QPs became ready, and the peer completes its Send
/// (from the ACK) before it receives the UD message, round after round, in blocking and in
/// busy-poll mode.
#[test]
fn a_deferred_ack_leaves_before_a_later_request_of_another_qp() {
    let _one = one_at_a_time();
    for busy_poll in [false, true] {
        let cfg = || UdpConfig::default().busy_poll(busy_poll);
        let (a, b) = (end(cfg()), end(cfg()));
        connect(&a.qp, b.dev.gid(), b.qp.qp_num(), Mtu::Mtu1024);
        connect(&b.qp, a.dev.gid(), a.qp.qp_num(), Mtu::Mtu1024);
        let ud = |e: &End| {
            let qp = e.pd.create_qp(&QpInitAttr::new(QpType::Ud, &e.cq, &e.cq).max_recv_wr(64)).unwrap();
            qp.modify(&QpAttr::to_init().port(1).pkey_index(0).qkey(0x1111)).unwrap();
            qp.modify(&QpAttr::new(QpState::Rtr)).unwrap();
            qp.modify(&QpAttr::to_rts().sq_psn(0)).unwrap();
            qp
        };
        let (a_ud, b_ud) = (ud(&a), ud(&b));
        let ah = a.pd.create_ah(&AhAttr::roce(b.dev.gid(), 0)).unwrap();
        let (ma, mb) =
            (a.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap(), b.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap());
        for round in 0..20u64 {
            a.qp.post_recv(&[RecvWr::new(round, &[ma.sge(0..64)])]).unwrap();
            b_ud.post_recv(&[RecvWr::new(1000 + round, &[mb.sge(64..200)])]).unwrap();
            // A spins on its CQ (a spinner by then, in blocking mode) until B's Send arrives.
            b.qp.post_send(&[SendWr::send(round, &[mb.sge(0..8)]).signaled()]).unwrap();
            let got = wait(&a.cq, 1, 10);
            assert_eq!((got[0].opcode, got[0].status), (WcOpcode::Recv, WcStatus::Success), "{got:?}");
            // Then sends from its UD QP and stops polling.
            a_ud.post_send(&[SendWr::send(round, &[ma.sge(64..72)]).ud(&ah, b_ud.qp_num(), 0x1111)]).unwrap();
            let wb = wait(&b.cq, 2, 10);
            let order: Vec<_> = wb.iter().map(|w| (w.opcode, w.status)).collect();
            assert_eq!(
                order,
                [(WcOpcode::Send, WcStatus::Success), (WcOpcode::Recv, WcStatus::Success)],
                "busy-poll {busy_poll}, round {round}: B's Send completed after the UD message arrived"
            );
        }
    }
}

/// Rule PKT-ROCE-3: the address vector's Traffic Class is the TOS byte of the datagrams on the
/// wire, though the UDP link's IP headers are the kernel's (it is told per message): an RC
/// QP's Send, the three datagrams of a long one (one GSO message), and a UD datagram through
/// an address handle of another Traffic Class, as a plain socket with `IP_RECVTOS` sees them.
/// DSCP 26 with ECT(0) (0x6a) is how RoCE fabrics commonly mark their lossless class.
#[test]
fn the_traffic_class_is_the_datagrams_tos() {
    let (hole, ip) = (2..=254u8)
        .map(|x| std::net::Ipv4Addr::new(127, 0, 0, x))
        .find_map(|ip| std::net::UdpSocket::bind((ip, 4791)).ok().map(|s| (s, ip)))
        .expect("a free 127.0.0.x:4791");
    softhca::link::udp::sys::report_ip_fields(std::os::fd::AsRawFd::as_raw_fd(&hole), false, true).unwrap();
    hole.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    let a = end(UdpConfig::default());
    let mut ah = AhAttr::roce(Gid::from_ipv4(ip), 0);
    ah.grh.traffic_class = Some(0x6a);
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    a.qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(all)).unwrap();
    let av = AddressVector::new(ah, Mtu::Mtu4096);
    a.qp.modify(&QpAttr::to_rtr(av, 0x123).rq_psn(0).max_dest_rd_atomic(1).min_rnr_timer(1)).unwrap();
    a.qp.modify(&QpAttr::to_rts().sq_psn(0).timeout(20).retry_cnt(1).rnr_retry(0).max_rd_atomic(1)).unwrap();
    let buf = a.pd.alloc_mr(10_000, Access::LOCAL_WRITE).unwrap();
    a.qp.post_send(&[SendWr::send(1, &[buf.sge(0..64)])]).unwrap();
    let r = plain::recv(&hole).expect("the Send");
    assert_eq!((r.len, r.tos), (12 + 64 + 4, Some(0x6a)));
    a.qp.post_send(&[SendWr::send(2, &[buf.sge(0..10_000)])]).unwrap();
    for k in 0..3 {
        let r = plain::recv(&hole).expect("the long Send's packets");
        assert_eq!(r.tos, Some(0x6a), "packet {k}: {r:?}");
    }

    let ud = a.pd.create_qp(&QpInitAttr::ud(&a.cq, &a.cq)).unwrap();
    ud.modify(&QpAttr::to_init().port(1).pkey_index(0).qkey(7)).unwrap();
    ud.modify(&QpAttr::new(QpState::Rtr)).unwrap();
    ud.modify(&QpAttr::to_rts().sq_psn(0)).unwrap();
    let mut uah = AhAttr::roce(Gid::from_ipv4(ip), 0);
    uah.grh.traffic_class = Some(0xb8);
    let uah = a.pd.create_ah(&uah).unwrap();
    ud.post_send(&[SendWr::send(3, &[buf.sge(0..32)]).ud(&uah, 0x77, 7)]).unwrap();
    let r = plain::recv(&hole).expect("the UD datagram");
    assert_eq!((r.len, r.tos), (12 + 8 + 32 + 4, Some(0xb8)));
}

/// Rule PKT-ROCE-11: over the UDP link in its socket receive mode, the IPv4 header in front of
/// a UD message is rebuilt (the socket hands over only the UDP payload), and its TOS and TTL
/// are the ones the datagram came with: the kernel reports them while the device has a UD QP.
#[test]
fn a_ud_receive_shows_the_tos_and_ttl_it_came_with() {
    let a = end(UdpConfig::default());
    let b = end(UdpConfig::default());
    let ud = |e: &udp_common::End| {
        let qp = e.pd.create_qp(&QpInitAttr::ud(&e.cq, &e.cq)).unwrap();
        qp.modify(&QpAttr::to_init().port(1).pkey_index(0).qkey(7)).unwrap();
        qp.modify(&QpAttr::new(QpState::Rtr)).unwrap();
        qp.modify(&QpAttr::to_rts().sq_psn(0)).unwrap();
        qp
    };
    let (qa, qb) = (ud(&a), ud(&b));
    let land = b.pd.alloc_mr(40 + 64, Access::LOCAL_WRITE).unwrap();
    let src = a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let mut attr = AhAttr::roce(b.dev.gid(), 0);
    attr.grh.traffic_class = Some(0x48);
    let ah = a.pd.create_ah(&attr).unwrap();
    // The engine turns the reports on at its next turn: a datagram sent at once may come
    // before that; every try posts a receive and sends again until one shows them.
    let mut seen = Vec::new();
    for round in 0..50u64 {
        qb.post_recv(&[RecvWr::new(round, &[land.sge(0..40 + 64)])]).unwrap();
        qa.post_send(&[SendWr::send(round, &[src.sge(0..64)]).ud(&ah, qb.qp_num(), 7)]).unwrap();
        let w = wait(&b.cq, 1, 10);
        assert_eq!(w[0].status, WcStatus::Success, "{w:?}");
        let grh = land.to_vec().unwrap();
        let ip = &grh[20..40];
        let sum = ip.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], c[1]]))).sum::<u32>();
        let once = (sum & 0xffff) + (sum >> 16);
        let folded = (once & 0xffff) + (once >> 16);
        seen.push((ip[1], ip[8], folded == 0xffff));
        if ip[1] == 0x48 {
            break;
        }
    }
    let last = *seen.last().unwrap();
    assert_eq!(last, (0x48, 64, true), "TOS, TTL and a valid checksum: {seen:?}");
}
