//! Every peer is untrusted: whatever arrives, a device never panics and stays in a valid
//! state (DESIGN rule 6). The tests run with overflow checks on, so arithmetic on peer values
//! that could wrap is caught too. Random bytes, and real packets with random
//! fields changed and the ICRC recomputed so they get past the link checks, are fed to devices
//! with QPs of every service type mid-conversation.

mod common;

use common::pair::*;
use proptest::prelude::*;
use softhca::link::sim::reseal;
use softhca::transport::MAX_DATAGRAM;
use softhca::*;

/// A conversation to take packets from: every RC operation plus UD and UC sends.
fn corpus() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
        let mut p = Pair::new(t, Mtu::Mtu256);
        let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
        let src = p.a.pd.alloc_mr(4096, all).unwrap();
        let dst = p.b.pd.alloc_mr(4096, all).unwrap();
        let ah = p.a.pd.create_ah(&AhAttr::roce(p.b.gid, 0)).unwrap();
        p.b.qp.post_recv(&[RecvWr::new(1, &[dst.sge(0..2048)]), RecvWr::new(2, &[dst.sge(2048..4096)])]).unwrap();
        let g = [src.sge(0..600)];
        let g8 = [src.sge(8..16)];
        let bq = p.b.qp.qp_num();
        let mut wrs = vec![SendWr::send(1, &g).ud(&ah, bq, 0x1111).imm(4)];
        if t != QpType::Ud {
            wrs.push(SendWr::rdma_write(2, &g, dst.addr(), dst.rkey()).imm(5));
        }
        if t == QpType::Rc {
            wrs.push(SendWr::rdma_read(3, &g, dst.addr(), dst.rkey()));
            wrs.push(SendWr::atomic_cmp_swp(4, &g8, dst.addr(), dst.rkey(), 0, 1));
            wrs.push(SendWr::atomic_fetch_add(5, &g8, dst.addr(), dst.rkey(), 1));
        }
        p.a.qp.post_send(&wrs).unwrap();
        p.run(1_000_000_000);
        out.extend(p.trace.into_iter().map(|(_, d)| d));
    }
    out
}

/// A fresh pair per case, with a Send half received so that the responder is mid-message.
fn targets() -> (Pair, Mr) {
    let p = Pair::new(QpType::Rc, Mtu::Mtu256);
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let guard = p.b.pd.alloc_mr(4096, all).unwrap();
    p.b.qp.post_recv(&[RecvWr::new(1, &[guard.sge(0..1024)])]).unwrap();
    let src = p.a.pd.alloc_mr(1000, Access::LOCAL_WRITE).unwrap();
    p.a.qp.post_send(&[SendWr::send(1, &[src.sge(0..1000)])]).unwrap();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let n = p.a.ctx.transmit(0, &mut buf).unwrap();
    p.b.ctx.receive(0, &buf[..n]);
    (p, guard)
}

fn feed(p: &mut Pair, d: &[u8]) {
    p.b.ctx.receive(p.now, d);
    p.a.ctx.receive(p.now, d);
    // Whatever they answer goes to the other side; then time passes.
    p.run(100_000_000);
    for qp in [&p.a.qp, &p.b.qp] {
        let s = qp.state().unwrap();
        assert!(QpState::ALL.contains(&s));
        let _ = qp.query().unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Rule PKT-VAL-1, PKT-HDR-3, PKT-OP-2
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let (mut p, _mr) = targets();
        feed(&mut p, &bytes);
    }

    /// Real packets with one to four fields scrambled and the ICRC made right again.
    #[test]
    fn mutated_packets_never_panic(
        pick in any::<prop::sample::Index>(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..5),
        truncate in proptest::option::of(any::<prop::sample::Index>()),
    ) {
        let corpus = corpus_cached();
        let mut d = corpus[pick.index(corpus.len())].clone();
        // Leave IP/UDP headers alone mostly: scramble from the UDP header on.
        for (at, v) in edits {
            let i = 20 + at.index(d.len() - 24);
            d[i] = v;
        }
        if let Some(t) = truncate {
            let n = 28 + t.index(d.len() - 28);
            d.truncate(n);
            let ip_len = (n as u16).to_be_bytes();
            d[2..4].copy_from_slice(&ip_len);
            let udp_len = ((n - 20) as u16).to_be_bytes();
            d[24..26].copy_from_slice(&udp_len);
        }
        let _ = reseal(&mut d);
        let (mut p, _mr) = targets();
        feed(&mut p, &d);
    }
}

fn corpus_cached() -> &'static Vec<Vec<u8>> {
    static CORPUS: std::sync::OnceLock<Vec<Vec<u8>>> = std::sync::OnceLock::new();
    CORPUS.get_or_init(corpus)
}
