//! Service ID Resolution (IBA 12.11): a UD service found by SIDR REQ / SIDR REP between two
//! CMs over a virtual MAD channel with a virtual clock and fixed seeds: loss, duplication,
//! an unknown service (status 1, Service ID not supported), a consumer's reject (status 2),
//! and a REQ that nobody answers (resent Max CM Retries times, then given up).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use softhca::transport::cm::*;
use softhca::wire::mad::{CmMessage, CmSidrRep, CmSidrReq};

const A: Peer = [1; 16];
const B: Peer = [2; 16];
const SERVICE: u64 = 0x0000_0000_0111_1c06;

/// Runs `a` (the requester) and `b` until nothing is in flight and no deadline is before
/// `until`; `b` answers each request with `answer`. Returns (a's events, b's events, SIDR REQs
/// a put on the wire).
/// The channel's faults: seed, loss and duplication rates, and whether b answers at all.
struct Faults(u64, f64, f64, bool);

fn run(
    a: &mut Cm,
    b: &mut Cm,
    Faults(seed, loss, dup, b_alive): Faults,
    until: u64,
    mut answer: impl FnMut(&mut Cm, u64, CommId),
) -> (Vec<CmEvent>, Vec<CmEvent>, usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut now = 0;
    let mut flight: Vec<(u64, bool, Vec<u8>)> = Vec::new();
    let (mut ev_a, mut ev_b, mut reqs) = (Vec::new(), Vec::new(), 0);
    loop {
        let mut busy = true;
        while busy {
            busy = false;
            for to_b in [true, false] {
                let src = if to_b { &mut *a } else { &mut *b };
                while let Some((_, mad)) = src.poll_transmit() {
                    busy = true;
                    if to_b && matches!(CmMessage::parse(&mad[..]), Ok((_, CmMessage::SidrReq(_)))) {
                        reqs += 1;
                    }
                    if !b_alive {
                        continue;
                    }
                    for _ in 0..if rng.random_bool(dup) { 2 } else { 1 } {
                        if !rng.random_bool(loss) {
                            flight.push((now + rng.random_range(1_000..300_000), to_b, mad.to_vec()));
                        }
                    }
                }
            }
            while let Some(e) = a.poll_event() {
                ev_a.push(e);
            }
            while let Some(e) = b.poll_event() {
                busy = true;
                if let CmEvent::SidrRequest { id, .. } = e {
                    answer(b, now, id);
                }
                ev_b.push(e);
            }
        }
        let next = [flight.iter().map(|f| f.0).min(), a.poll_timeout(), b.poll_timeout()].into_iter().flatten().min();
        match next {
            Some(t) if t <= until => now = now.max(t),
            _ => return (ev_a, ev_b, reqs),
        }
        flight.sort_by_key(|f| f.0);
        let due: Vec<_> = flight.iter().take_while(|f| f.0 <= now).cloned().collect();
        flight.drain(..due.len());
        for (_, to_b, mad) in due {
            if to_b {
                b.handle_mad(now, A, &mad)
            } else {
                a.handle_mad(now, B, &mad)
            }
        }
        a.handle_timeout(now);
        b.handle_timeout(now);
    }
}

fn req() -> CmSidrReq {
    let mut r = CmSidrReq { partition_key: 0xFFFF, service_id: SERVICE, ..Default::default() };
    r.private_data[..5].copy_from_slice(b"hello");
    r
}

fn reply(cm: &mut Cm, now: u64, id: CommId) {
    let mut rep = CmSidrRep { qpn: 0x42, qkey: 0x0123_4567, service_id: SERVICE, ..Default::default() };
    rep.private_data[..3].copy_from_slice(b"yes");
    assert!(cm.sidr_reply(now, id, rep));
}

/// One SidrReply for the requester, one SidrRequest for the responder, whatever is lost or
/// duplicated (each side's retries answer the loss, the responder answers a repeat with the
/// same REP).
#[test]
fn sidr_resolves_the_service_under_loss_and_duplication() {
    for seed in 0..40 {
        let (mut a, mut b) = (Cm::new(0xA), Cm::new(0xB));
        b.listen(SERVICE);
        let id = a.sidr_request(0, B, req(), 14, 15);
        let (ev_a, ev_b, _) = run(&mut a, &mut b, Faults(seed, 0.10, 0.10, true), 60_000_000_000, reply);
        assert_eq!(ev_b.len(), 1, "seed {seed}: {ev_b:?}");
        let CmEvent::SidrRequest { peer, req, .. } = &ev_b[0] else { panic!("seed {seed}: {ev_b:?}") };
        assert_eq!((*peer, &req.private_data[..5]), (A, &b"hello"[..]));
        assert_eq!(ev_a.len(), 1, "seed {seed}: {ev_a:?}");
        let CmEvent::SidrReply { id: got, rep } = &ev_a[0] else { panic!("seed {seed}: {ev_a:?}") };
        assert_eq!((*got, rep.status, rep.qpn, rep.qkey), (id, 0, 0x42, 0x0123_4567));
        assert_eq!(&rep.private_data[..3], b"yes");
        assert_eq!((a.pending(), b.pending()), (0, 0));
        assert_eq!(a.poll_timeout().or(b.poll_timeout()), None, "seed {seed}: state left");
    }
}

#[test]
fn a_service_nobody_listens_to_is_not_supported() {
    let (mut a, mut b) = (Cm::new(0xA), Cm::new(0xB));
    let id = a.sidr_request(0, B, req(), 14, 3);
    let (ev_a, ev_b, _) = run(&mut a, &mut b, Faults(1, 0.0, 0.0, true), 60_000_000_000, reply);
    assert!(ev_b.is_empty());
    let [CmEvent::SidrReply { id: got, rep }] = &ev_a[..] else { panic!("{ev_a:?}") };
    assert_eq!((*got, rep.status), (id, sidr_status::UNSUPPORTED));
    assert_eq!(b.counters().rejected_no_listener, 1);
}

#[test]
fn a_consumer_reject_is_status_reject() {
    let (mut a, mut b) = (Cm::new(0xA), Cm::new(0xB));
    b.listen(SERVICE);
    a.sidr_request(0, B, req(), 14, 3);
    let (ev_a, _, _) = run(&mut a, &mut b, Faults(1, 0.0, 0.0, true), 60_000_000_000, |cm, _, id| {
        assert!(cm.sidr_reject(id, sidr_status::REJECT, b"no"));
    });
    let [CmEvent::SidrReply { rep, .. }] = &ev_a[..] else { panic!("{ev_a:?}") };
    assert_eq!((rep.status, &rep.private_data[..2]), (sidr_status::REJECT, &b"no"[..]));
    assert_eq!(b.pending(), 0);
}

/// Nobody answers: the REQ goes out 1 + Max CM Retries times, a Timeout ends it.
#[test]
fn an_unanswered_sidr_req_is_resent_max_cm_retries_times_then_times_out() {
    for retries in [0u8, 1, 5, 15] {
        let (mut a, mut b) = (Cm::new(0xA), Cm::new(0xB));
        let id = a.sidr_request(0, B, req(), 10, retries);
        let (ev_a, _, reqs) = run(&mut a, &mut b, Faults(1, 0.0, 0.0, false), u64::MAX, reply);
        assert_eq!(reqs, 1 + usize::from(retries));
        assert_eq!(ev_a, vec![CmEvent::Rejected { id, reason: reason::TIMEOUT, private_data: vec![] }]);
        assert_eq!(a.poll_timeout(), None);
    }
}

/// A responder whose consumer never answers forgets the request after its time-wait, and a
/// destroyed one refuses it (status 2): nothing stays pending.
#[test]
fn unanswered_requests_do_not_stay() {
    let (mut a, mut b) = (Cm::new(0xA), Cm::new(0xB));
    b.listen(SERVICE);
    a.sidr_request(0, B, req(), 30, 0);
    let (_, ev_b, _) = run(&mut a, &mut b, Faults(1, 0.0, 0.0, true), 1_000_000, |_, _, _| {});
    assert_eq!(b.pending(), 1);
    let CmEvent::SidrRequest { id, .. } = ev_b[0] else { panic!() };
    b.destroy(id);
    assert_eq!(b.pending(), 0);
    let (ev_a, _, _) = run(&mut a, &mut b, Faults(1, 0.0, 0.0, true), 60_000_000_000, reply);
    let [CmEvent::SidrReply { rep, .. }] = &ev_a[..] else { panic!("{ev_a:?}") };
    assert_eq!(rep.status, sidr_status::REJECT);
    let (mut a, mut b) = (Cm::new(0xA), Cm::new(0xB));
    b.listen(SERVICE);
    a.sidr_request(0, B, req(), 30, 0);
    run(&mut a, &mut b, Faults(1, 0.0, 0.0, true), u64::MAX, |_, _, _| {});
    assert_eq!((b.pending(), b.poll_timeout()), (0, None));
}
