//! Two connected devices with a minimal lossless driver, for transport tests that do not need
//! the simulated fabric's faults.
#![allow(dead_code)]

use softhca::transport::MAX_DATAGRAM;
use softhca::*;

pub struct Side {
    pub ctx: Context,
    pub pd: Pd,
    pub cq: Cq,
    pub qp: Qp,
    pub gid: Gid,
}

/// Sees each datagram before delivery (`true` when it comes from `a`); false drops it.
pub type Filter = Box<dyn FnMut(bool, &mut Vec<u8>) -> bool>;

pub struct Pair {
    pub a: Side,
    pub b: Side,
    pub now: u64,
    /// Every datagram that crossed, in order: (from a?, bytes).
    pub trace: Vec<(bool, Vec<u8>)>,
    /// Called on each datagram before delivery; returning false drops it.
    pub filter: Option<Filter>,
}

fn side(n: u8, qp_type: QpType) -> Side {
    let gid = Gid::from_ipv4([127, 1, 0, n].into());
    let ctx = Context::create(DeviceConfig::default().name(format!("pair{n}")).gid0(gid).seed(n as u64)).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4096).unwrap();
    let qp = pd
        .create_qp(
            &QpInitAttr::new(qp_type, &cq, &cq).max_send_wr(1024).max_recv_wr(1024).max_send_sge(8).max_recv_sge(8),
        )
        .unwrap();
    Side { ctx, pd, cq, qp, gid }
}

pub fn connect(x: &Side, y: &Side, mtu: Mtu) {
    let av = AddressVector::new(AhAttr::roce(y.gid, 0), mtu);
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    match x.qp.qp_type() {
        QpType::Ud => {
            x.qp.modify(&QpAttr::to_init().port(1).pkey_index(0).qkey(0x1111)).unwrap();
            x.qp.modify(&QpAttr::new(QpState::Rtr)).unwrap();
            x.qp.modify(&QpAttr::to_rts().sq_psn(100)).unwrap();
        }
        QpType::Uc => {
            x.qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(Access::REMOTE_WRITE)).unwrap();
            x.qp.modify(&QpAttr::to_rtr(av, y.qp.qp_num()).rq_psn(100)).unwrap();
            x.qp.modify(&QpAttr::to_rts().sq_psn(100)).unwrap();
        }
        _ => {
            x.qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(all)).unwrap();
            x.qp.modify(&QpAttr::to_rtr(av, y.qp.qp_num()).rq_psn(100).max_dest_rd_atomic(16).min_rnr_timer(1))
                .unwrap();
            x.qp.modify(&QpAttr::to_rts().sq_psn(100).timeout(10).retry_cnt(7).rnr_retry(7).max_rd_atomic(16)).unwrap();
        }
    }
}

impl Pair {
    pub fn new(qp_type: QpType, mtu: Mtu) -> Pair {
        let a = side(1, qp_type);
        let b = side(2, qp_type);
        connect(&a, &b, mtu);
        connect(&b, &a, mtu);
        Pair { a, b, now: 0, trace: Vec::new(), filter: None }
    }

    /// Shuttles datagrams both ways and runs timers until nothing is pending or `max_ns` of
    /// virtual time has passed.
    pub fn run(&mut self, max_ns: u64) {
        let end = self.now + max_ns;
        let mut buf = vec![0u8; MAX_DATAGRAM];
        loop {
            let mut moved = false;
            for from_a in [true, false] {
                let (src, dst) = if from_a { (&self.a.ctx, &self.b.ctx) } else { (&self.b.ctx, &self.a.ctx) };
                while let Some(n) = src.transmit(self.now, &mut buf) {
                    let mut d = buf[..n].to_vec();
                    moved = true;
                    let pass = self.filter.as_mut().is_none_or(|f| f(from_a, &mut d));
                    self.trace.push((from_a, d.clone()));
                    if pass {
                        dst.receive(self.now, &d);
                    }
                }
            }
            if moved {
                continue;
            }
            let next = [self.a.ctx.poll_timeout(), self.b.ctx.poll_timeout()].into_iter().flatten().min();
            match next {
                Some(t) if t <= end => {
                    self.now = self.now.max(t);
                    self.a.ctx.handle_timeout(self.now);
                    self.b.ctx.handle_timeout(self.now);
                }
                _ => return,
            }
        }
    }
}
