//! A local buffer whose region is deregistered while a message still uses it: the next packet
//! that would touch it checks its key again (the device's key generation moved) and the
//! message fails instead, as it fails on a packet's remote key. Through the C ABI a region is
//! the program's memory, which it may free right after `ibv_dereg_mr`: a later write there
//! corrupts its heap. Both ends are checked: the requester's Read responses landing, and the
//! responder's Send filling an RQ WQE.

mod common;

use std::sync::{Arc, Mutex};

use common::pair::*;
use common::poll_all;
use softhca::*;

const RUN: u64 = 10_000_000_000;

/// A filter that holds back the datagrams from one side (`from_a`) after the first `pass`
/// of them, for the test to hand over later.
fn hold_after(from_a: bool, pass: usize, held: &Arc<Mutex<Vec<Vec<u8>>>>) -> Filter {
    let held = held.clone();
    let mut seen = 0;
    Box::new(move |a, d| {
        if a != from_a {
            return true;
        }
        seen += 1;
        if seen <= pass {
            return true;
        }
        held.lock().unwrap().push(d.clone());
        false
    })
}

/// Deregisters `mr`, hands the held datagrams to their side (`to_a`) and runs; returns the
/// first completion of that side's CQ as (wr_id, status).
fn dereg_then_deliver(p: &mut Pair, mr: &Mr, held: &Arc<Mutex<Vec<Vec<u8>>>>, to_a: bool) -> Option<(u64, WcStatus)> {
    mr.dereg().unwrap();
    p.filter = None;
    for d in std::mem::take(&mut *held.lock().unwrap()) {
        p.inject(to_a, &d);
    }
    p.run(RUN);
    let cq = if to_a { &p.a.cq } else { &p.b.cq };
    poll_all(cq).first().map(|w| (w.wr_id, w.status))
}

/// Rule WR-COM-9: a Read whose landing region is deregistered before its responses arrive
/// completes with Local Protection Error, and the responses write nothing there (before, they
/// landed in the deregistered region and the Read completed successfully).
#[test]
fn read_responses_after_dereg_land_nowhere() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.b.pd.reg_mr(vec![0xA5; 4096], Access::LOCAL_WRITE | Access::REMOTE_READ).unwrap();
    let mut land = vec![0u8; 4096];
    // SAFETY: `land` outlives the region (deregistered below) and is not touched meanwhile.
    let mr = unsafe { p.a.pd.reg_mr_raw(land.as_mut_ptr(), land.len(), Access::LOCAL_WRITE) }.unwrap();
    let held = Arc::new(Mutex::new(Vec::new()));
    p.filter = Some(hold_after(false, 0, &held));
    p.a.qp.post_send(&[SendWr::rdma_read(1, &[mr.sge(0..4096)], src.addr(), src.rkey()).signaled()]).unwrap();
    p.run(1_000_000); // the request goes; its four responses are held
    assert!(held.lock().unwrap().len() >= 4);
    assert_eq!(dereg_then_deliver(&mut p, &mr, &held, true), Some((1, WcStatus::LocProtErr)));
    assert!(land.iter().all(|&b| b == 0), "a response landed in the deregistered region");
}

/// Rule ERR-RQ-2: a Send whose RQ WQE's region is deregistered after its first packet landed
/// fails that WQE (Local QP Operation Error, the QP to Error) and writes none of the later
/// packets there (before, the whole message landed and the receive completed).
#[test]
fn a_send_after_its_receive_region_is_deregistered_writes_nothing_more() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let mut land = vec![0u8; 4096];
    // SAFETY: `land` outlives the region (deregistered below) and is not touched meanwhile.
    let mr = unsafe { p.b.pd.reg_mr_raw(land.as_mut_ptr(), land.len(), Access::LOCAL_WRITE) }.unwrap();
    p.b.qp.post_recv(&[RecvWr::new(7, &[mr.sge(0..4096)])]).unwrap();
    let src = p.a.pd.reg_mr(vec![0x5A; 4096], Access::LOCAL_WRITE).unwrap();
    let held = Arc::new(Mutex::new(Vec::new()));
    p.filter = Some(hold_after(true, 1, &held)); // the Send's first packet lands, three wait
    p.a.qp.post_send(&[SendWr::send(1, &[src.sge(0..4096)]).signaled()]).unwrap();
    p.run(1_000_000);
    assert!(land[..1024].iter().all(|&b| b == 0x5A), "the first packet landed");
    assert_eq!(dereg_then_deliver(&mut p, &mr, &held, false), Some((7, WcStatus::LocQpOpErr)));
    assert!(land[1024..].iter().all(|&b| b == 0), "a later packet landed in the deregistered region");
    assert_eq!(p.b.qp.state().unwrap(), QpState::Error);
}

/// Rule WR-COM-9: a Send whose source region is deregistered while its packets still have to
/// be sent again (lost, retransmitted after the ACK timeout) completes with Local Protection
/// Error, and nothing more of the region leaves (before, the retransmission read it again).
#[test]
fn a_retransmission_after_dereg_reads_nothing() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let land = p.b.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    p.b.qp.post_recv(&[RecvWr::new(7, &[land.sge(0..4096)])]).unwrap();
    let mut src = vec![0x5Au8; 4096];
    // SAFETY: `src` outlives the region (deregistered below) and is not touched meanwhile.
    let mr = unsafe { p.a.pd.reg_mr_raw(src.as_mut_ptr(), src.len(), Access::LOCAL_WRITE) }.unwrap();
    // Everything a sends is lost: the four packets go, and go again at each timeout.
    p.filter = Some(Box::new(|from_a, _| !from_a));
    p.a.qp.post_send(&[SendWr::send(1, &[mr.sge(0..4096)]).signaled()]).unwrap();
    p.run(1_000_000);
    assert!(p.sent_by(true).len() >= 4);
    mr.dereg().unwrap();
    p.filter = None;
    p.clear_trace();
    p.run(RUN);
    let wcs = poll_all(&p.a.cq);
    assert_eq!(wcs.first().map(|w| (w.wr_id, w.status)), Some((1, WcStatus::LocProtErr)), "{wcs:?}");
    let sends = p.sent_by(true).iter().filter(|k| k.opcode.info().is_some_and(|i| i.payload)).count();
    assert_eq!(sends, 0, "a packet with the deregistered region's bytes left");
    drop(src);
}
