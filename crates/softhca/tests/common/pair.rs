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

/// The knobs transport tests turn; `Opts::default()` is what `Pair::new` uses.
#[derive(Debug, Clone, Copy)]
pub struct Opts {
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    /// Inbound enables of both QPs.
    pub access: Access,
    pub cq_size: u32,
    pub sq_psn: u32,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            timeout: 10,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            access: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
            cq_size: 4096,
            sq_psn: 100,
        }
    }
}

fn side(n: u8, qp_type: QpType, o: &Opts) -> Side {
    let gid = Gid::from_ipv4([127, 1, 0, n].into());
    let ctx = Context::create(DeviceConfig::default().name(format!("pair{n}")).gid0(gid).seed(n as u64)).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(o.cq_size).unwrap();
    let qp = pd
        .create_qp(
            &QpInitAttr::new(qp_type, &cq, &cq).max_send_wr(1024).max_recv_wr(1024).max_send_sge(8).max_recv_sge(8),
        )
        .unwrap();
    Side { ctx, pd, cq, qp, gid }
}

pub fn connect(x: &Side, y: &Side, mtu: Mtu, o: &Opts) {
    let av = AddressVector::new(AhAttr::roce(y.gid, 0), mtu);
    let all = o.access;
    let psn = o.sq_psn;
    match x.qp.qp_type() {
        QpType::Ud => {
            x.qp.modify(&QpAttr::to_init().port(1).pkey_index(0).qkey(0x1111)).unwrap();
            x.qp.modify(&QpAttr::new(QpState::Rtr)).unwrap();
            x.qp.modify(&QpAttr::to_rts().sq_psn(psn)).unwrap();
        }
        QpType::Uc => {
            x.qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(Access::REMOTE_WRITE)).unwrap();
            x.qp.modify(&QpAttr::to_rtr(av, y.qp.qp_num()).rq_psn(psn)).unwrap();
            x.qp.modify(&QpAttr::to_rts().sq_psn(psn)).unwrap();
        }
        _ => {
            x.qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(all)).unwrap();
            x.qp.modify(
                &QpAttr::to_rtr(av, y.qp.qp_num())
                    .rq_psn(psn)
                    .max_dest_rd_atomic(o.max_dest_rd_atomic)
                    .min_rnr_timer(o.min_rnr_timer),
            )
            .unwrap();
            x.qp.modify(
                &QpAttr::to_rts()
                    .sq_psn(psn)
                    .timeout(o.timeout)
                    .retry_cnt(o.retry_cnt)
                    .rnr_retry(o.rnr_retry)
                    .max_rd_atomic(o.max_rd_atomic),
            )
            .unwrap();
        }
    }
}

impl Pair {
    pub fn new(qp_type: QpType, mtu: Mtu) -> Pair {
        Pair::with(qp_type, mtu, Opts::default())
    }

    pub fn with(qp_type: QpType, mtu: Mtu, o: Opts) -> Pair {
        let a = side(1, qp_type, &o);
        let b = side(2, qp_type, &o);
        connect(&a, &b, mtu, &o);
        connect(&b, &a, mtu, &o);
        Pair { a, b, now: 0, trace: Vec::new(), filter: None }
    }

    /// Two sides with QPs in Reset, for tests that bring them up themselves.
    pub fn unconnected(qp_type: QpType) -> Pair {
        let o = Opts::default();
        Pair { a: side(1, qp_type, &o), b: side(2, qp_type, &o), now: 0, trace: Vec::new(), filter: None }
    }

    /// Hands a datagram to one side as if it came off the wire.
    pub fn inject(&mut self, to_a: bool, d: &[u8]) {
        let ctx = if to_a { &self.a.ctx } else { &self.b.ctx };
        ctx.receive(self.now, d);
    }

    /// The packets one side sent, parsed: (opcode, PSN, AckReq, SE, AETH syndrome).
    pub fn sent_by(&self, a: bool) -> Vec<Pkt> {
        self.trace.iter().filter(|(from_a, _)| *from_a == a).map(|(_, d)| Pkt::parse(d)).collect()
    }

    /// a sends `msg` as a Send with Invalidate naming `rkey` into a receive b posts (wr_id
    /// 5): returns a's completions and b's.
    pub fn send_with_invalidate(&mut self, msg: &[u8], rkey: u32, run_ns: u64) -> (Vec<Wc>, Vec<Wc>) {
        let land = self.b.pd.alloc_mr(64.max(msg.len()), Access::LOCAL_WRITE).unwrap();
        self.b.qp.post_recv(&[RecvWr::new(5, &[land.sge(0..land.len())])]).unwrap();
        let src = self.a.pd.reg_mr(msg.to_vec(), Access::LOCAL_WRITE).unwrap();
        self.a.qp.post_send(&[SendWr::send_with_inv(2, &[src.sge(0..msg.len())], rkey).signaled()]).unwrap();
        self.run(run_ns);
        (super::poll_all(&self.a.cq), super::poll_all(&self.b.cq))
    }

    /// Stops keeping a trace (and forgets it).
    pub fn clear_trace(&mut self) {
        self.trace.clear();
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

/// One traced packet, reduced to what transport tests look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pkt {
    pub opcode: softhca::wire::Opcode,
    pub psn: u32,
    pub ack_req: bool,
    pub se: bool,
    pub dest_qp: u32,
    pub syndrome: Option<softhca::wire::Syndrome>,
    pub msn: Option<u32>,
    pub payload_len: usize,
}

impl Pkt {
    pub fn parse(d: &[u8]) -> Pkt {
        let r = softhca::wire::roce::parse_ip(d).expect("a valid RoCEv2 datagram");
        let p = r.packet;
        Pkt {
            opcode: p.bth.opcode,
            psn: p.bth.psn.value(),
            ack_req: p.bth.ack_req,
            se: p.bth.se,
            dest_qp: p.bth.dest_qp,
            syndrome: p.aeth.map(|a| a.syndrome),
            msn: p.aeth.map(|a| a.msn),
            payload_len: p.payload.len(),
        }
    }
}
