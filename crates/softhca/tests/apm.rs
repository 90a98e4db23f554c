//! Automatic Path Migration (IBA 17.2.8) between two devices with two GIDs each: a primary
//! path GID 0 ↔ GID 0 and an alternate GID 1 ↔ GID 1. The consumer loads the alternate path and
//! rearms (softhca arms at once); when the primary path dies the requester runs out of retries
//! there, migrates and carries on over the alternate with its counts reloaded, its packets
//! with MigReq set; the responder, armed too, follows when such a packet comes over its
//! alternate path. Both raise Path Migrated; no completion is lost or repeated.

use softhca::transport::MAX_DATAGRAM;
use softhca::wire::roce;
use softhca::*;

const A0: [u8; 4] = [127, 3, 0, 1];
const A1: [u8; 4] = [127, 3, 1, 1];
const B0: [u8; 4] = [127, 3, 0, 2];
const B1: [u8; 4] = [127, 3, 1, 2];

fn gid(ip: [u8; 4]) -> Gid {
    Gid::from_ipv4(ip.into())
}

struct End {
    ctx: Context,
    pd: Pd,
    cq: Cq,
    qp: Qp,
}

fn end(n: u8, g0: [u8; 4], g1: [u8; 4], apm: bool) -> End {
    let mut cfg = DeviceConfig::default().name(format!("apm{n}")).gid0(gid(g0)).seed(u64::from(n));
    cfg.port.gid_tbl_len = 2;
    cfg.attr.auto_path_mig = apm;
    let ctx = Context::create(cfg).unwrap();
    ctx.set_gid(1, gid(g1)).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256).unwrap();
    let qp = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq).max_send_wr(64).max_recv_wr(64)).unwrap();
    End { ctx, pd, cq, qp }
}

fn alt_to(peer: [u8; 4]) -> AltPath {
    AltPath {
        av: AddressVector::new(AhAttr::roce(gid(peer), 1), Mtu::Mtu1024),
        pkey_index: 0,
        port_num: 1,
        timeout: 12,
    }
}

/// Both QPs to RTS on the primary path with the alternate loaded and rearmed (as the CM's
/// LAP/APR or the REQ's alternate path would load it).
fn connect(x: &End, y: &End, y0: [u8; 4], y1: [u8; 4]) {
    connect_with(x, y, y0, y1, Some(MigState::Rearm));
}

fn connect_with(x: &End, y: &End, y0: [u8; 4], y1: [u8; 4], mig: Option<MigState>) {
    let av = AddressVector::new(AhAttr::roce(gid(y0), 0), Mtu::Mtu1024);
    x.qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(Access::REMOTE_WRITE)).unwrap();
    x.qp.modify(&QpAttr::to_rtr(av, y.qp.qp_num()).rq_psn(0x100).max_dest_rd_atomic(1).min_rnr_timer(1)).unwrap();
    x.qp.modify(
        &QpAttr::to_rts().sq_psn(0x100).timeout(12).retry_cnt(2).rnr_retry(7).max_rd_atomic(1).alt_path(alt_to(y1)),
    )
    .unwrap();
    if let Some(state) = mig {
        x.qp.modify(&QpAttr::to_rts().path_mig_state(state)).unwrap();
    }
}

/// Shuttles datagrams between `a` and `b` and runs their timers up to `until`; `cut` drops
/// what travels between the two GID 0s (the primary path).
fn run(a: &End, b: &End, now: &mut u64, until: u64, cut: bool, trace: &mut Vec<(bool, bool, bool)>) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let mut moved = false;
        for from_a in [true, false] {
            let (src, dst) = if from_a { (a, b) } else { (b, a) };
            while let Some(n) = src.ctx.transmit(*now, &mut buf) {
                moved = true;
                let d = roce::parse_ip(&buf[..n]).unwrap();
                let primary = d.ip.dst_gid() == gid(if from_a { B0 } else { A0 }).to_ipv6();
                trace.push((from_a, primary, d.packet.bth.mig_req));
                if !(cut && primary) {
                    dst.ctx.receive(*now, &buf[..n]);
                }
            }
        }
        if moved {
            continue;
        }
        match [a.ctx.poll_timeout(), b.ctx.poll_timeout()].into_iter().flatten().min() {
            Some(t) if t <= until => {
                *now = (*now).max(t);
                a.ctx.handle_timeout(*now);
                b.ctx.handle_timeout(*now);
            }
            _ => return,
        }
    }
}

fn events(ctx: &Context) -> Vec<AsyncEventType> {
    std::iter::from_fn(|| ctx.get_async_event()).map(|e| e.event_type).collect()
}

/// Rule EVT-PM-1
#[test]
fn a_dead_primary_path_migrates_both_ends_to_the_alternate() {
    let (a, b) = (end(1, A0, A1, true), end(2, B0, B1, true));
    connect(&a, &b, B0, B1);
    connect(&b, &a, A0, A1);
    assert_eq!(a.qp.query().unwrap().path_mig_state, MigState::Armed);
    let src = a.pd.reg_mr(vec![7u8; 4096], Access::LOCAL_WRITE).unwrap();
    let dst = b.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let (mut now, mut trace) = (0u64, Vec::new());
    // One Send over the primary path: armed, so MigReq is clear.
    b.qp.post_recv(&[RecvWr::new(1, &[dst.sge(0..1024)])]).unwrap();
    a.qp.post_send(&[SendWr::send(1, &[src.sge(0..1024)]).signaled()]).unwrap();
    let until = now + 1_000_000_000;
    run(&a, &b, &mut now, until, false, &mut trace);
    assert!(trace.iter().all(|&(_, primary, mig)| primary && !mig), "{trace:?}");
    trace.clear();
    // The primary path dies; four more Sends.
    let sges: Vec<_> = (0..4).map(|i| [src.sge(i * 1024..(i + 1) * 1024)]).collect();
    let rsges: Vec<_> = (0..4).map(|i| [dst.sge(i * 1024..(i + 1) * 1024)]).collect();
    for (i, s) in rsges.iter().enumerate() {
        b.qp.post_recv(&[RecvWr::new(10 + i as u64, s)]).unwrap();
    }
    let wrs: Vec<_> = sges.iter().enumerate().map(|(i, s)| SendWr::send(10 + i as u64, s).signaled()).collect();
    a.qp.post_send(&wrs).unwrap();
    let until = now + 60_000_000_000;
    run(&a, &b, &mut now, until, true, &mut trace);
    // Every Send completed once, in order, successfully; the responder received each once.
    let wa: Vec<_> = std::iter::from_fn(|| a.cq.poll_one().unwrap()).map(|w| (w.wr_id, w.status)).collect();
    let want: Vec<_> = [1, 10, 11, 12, 13].into_iter().map(|i| (i, WcStatus::Success)).collect();
    assert_eq!(wa, want);
    let wb: Vec<_> = std::iter::from_fn(|| b.cq.poll_one().unwrap()).map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(wb, want);
    // Both migrated (Migrated, the alternate is the path now, none left) and said so.
    for e in [&a, &b] {
        let q = e.qp.query().unwrap();
        assert_eq!((q.qp_state, q.path_mig_state, q.alt), (QpState::Rts, MigState::Migrated, None));
        assert_eq!(events(&e.ctx), vec![AsyncEventType::PathMig]);
    }
    assert_eq!(a.qp.query().unwrap().av.unwrap().ah.grh.dgid, Some(gid(B1)));
    // After the migration everything went over the alternate path, MigReq set.
    let first_alt = trace.iter().position(|&(_, primary, _)| !primary).expect("traffic on the alternate path");
    assert!(trace[first_alt..].iter().all(|&(_, primary, mig)| !primary && mig), "{trace:?}");
}

/// The responder has the alternate path loaded but never rearmed it: the requester's
/// migration request (its MigReq packets over the alternate path) is refused, dropped, and
/// reported once as Path Migration Request Error however many retries bring it. Once the
/// consumer rearms, the next retry is followed and the Send completes.
/// Rule EVT-AE-1
#[test]
fn an_unarmed_responder_refuses_the_migration_request_once() {
    let (a, b) = (end(7, A0, A1, true), end(8, B0, B1, true));
    connect(&a, &b, B0, B1);
    connect_with(&b, &a, A0, A1, None);
    assert_eq!(b.qp.query().unwrap().path_mig_state, MigState::Migrated);
    let src = a.pd.reg_mr(vec![7u8; 1024], Access::LOCAL_WRITE).unwrap();
    let dst = b.pd.alloc_mr(1024, Access::LOCAL_WRITE).unwrap();
    b.qp.post_recv(&[RecvWr::new(1, &[dst.sge(0..1024)])]).unwrap();
    a.qp.post_send(&[SendWr::send(1, &[src.sge(0..1024)]).signaled()]).unwrap();
    let (mut now, mut trace) = (0u64, Vec::new());
    // Step the virtual clock until the requester has migrated and retried over the
    // alternate path at least twice (timeout 12: 16.8 ms; retry_cnt 2 on each path).
    let mut b_events = Vec::new();
    while b.ctx.counters().migrations_refused < 2 {
        assert!(now < 1_000_000_000, "no migration request came: {trace:?}");
        let until = now + 1_000_000;
        run(&a, &b, &mut now, until, true, &mut trace);
        now = until;
        b_events.extend(events(&b.ctx));
    }
    assert_eq!(b_events, vec![AsyncEventType::PathMigErr]);
    assert_eq!(events(&a.ctx), vec![AsyncEventType::PathMig]);
    assert_eq!(b.cq.poll_one().unwrap().map(|w| w.wr_id), None, "nothing was received");
    // The responder's consumer rearms; the requester's next retry is followed.
    b.qp.modify(&QpAttr::to_rts().path_mig_state(MigState::Rearm)).unwrap();
    let until = now + 1_000_000_000;
    run(&a, &b, &mut now, until, true, &mut trace);
    assert_eq!(a.cq.poll_one().unwrap().map(|w| (w.wr_id, w.status)), Some((1, WcStatus::Success)));
    assert_eq!(b.cq.poll_one().unwrap().map(|w| (w.wr_id, w.status)), Some((1, WcStatus::Success)));
    assert_eq!(events(&b.ctx), vec![AsyncEventType::PathMig]);
    assert_eq!(b.qp.query().unwrap().av.unwrap().ah.grh.dgid, Some(gid(A1)));
}

/// The consumer migrates by hand (Migrated while armed): the path switches at once, with no
/// Path Migrated event (EVT-PM-1 names the automatic migrations).
#[test]
fn a_consumer_migration_switches_without_an_event() {
    let (a, b) = (end(3, A0, A1, true), end(4, B0, B1, true));
    connect(&a, &b, B0, B1);
    connect(&b, &a, A0, A1);
    a.qp.modify(&QpAttr::to_rts().path_mig_state(MigState::Migrated)).unwrap();
    let q = a.qp.query().unwrap();
    assert_eq!((q.path_mig_state, q.av.unwrap().ah.grh.dgid, q.timeout), (MigState::Migrated, Some(gid(B1)), 12));
    assert!(events(&a.ctx).is_empty());
    // Rearm with nothing loaded is refused; Armed is not the consumer's to set.
    assert!(a.qp.modify(&QpAttr::to_rts().path_mig_state(MigState::Rearm)).is_err());
    assert!(a.qp.modify(&QpAttr::to_rts().path_mig_state(MigState::Armed)).is_err());
}

/// MOD-GEN-9: on a device without APM the alternate path is NotSupported, at a transition
/// whose table takes it (Init → RTR).
/// Rule MOD-GEN-9
#[test]
fn without_apm_an_alternate_path_is_not_supported() {
    let (a, b) = (end(5, A0, A1, false), end(6, B0, B1, false));
    a.qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(Access::REMOTE_WRITE)).unwrap();
    let av = AddressVector::new(AhAttr::roce(gid(B0), 0), Mtu::Mtu1024);
    let rtr = QpAttr::to_rtr(av, b.qp.qp_num()).rq_psn(0).max_dest_rd_atomic(1).min_rnr_timer(1);
    assert!(matches!(a.qp.modify(&rtr.clone().alt_path(alt_to(B1))), Err(VerbsError::NotSupported(_))));
    a.qp.modify(&rtr).unwrap();
}
