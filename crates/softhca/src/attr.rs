//! The Modify QP attribute mask: one bit per parameter of the digest's Modify QP table. On the
//! ground floor beside `types` and `error`, which both name it, and importing neither.

bitflags::bitflags! {
    /// One bit per Modify QP parameter of the digest ("MOD — Parameters").
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct AttrMask: u32 {
        /// Inbound RDMA Read enable.
        const READ_EN = 1 << 0;
        /// Inbound RDMA Write enable.
        const WRITE_EN = 1 << 1;
        /// Inbound Atomic enable.
        const ATOMIC_EN = 1 << 2;
        /// Primary P_Key index.
        const PKEY_INDEX = 1 << 3;
        const QKEY = 1 << 4;
        /// HCA port number.
        const PORT = 1 << 5;
        /// RQ Start ePSN.
        const RQ_PSN = 1 << 6;
        /// Inbound depth (responder resources).
        const MAX_DEST_RD_ATOMIC = 1 << 7;
        /// Remote Node Address Vector (address, path MTU, optionally RC timeout and retries).
        const AV = 1 << 8;
        /// Destination QPN.
        const DEST_QPN = 1 << 9;
        /// Alternate path information.
        const ALT_PATH = 1 << 10;
        /// New SQ / RQ size.
        const CAP = 1 << 11;
        /// Minimum RNR NAK Timer.
        const MIN_RNR_TIMER = 1 << 12;
        /// Local ACK Timeout.
        const TIMEOUT = 1 << 13;
        /// SQ Start PSN.
        const SQ_PSN = 1 << 14;
        const RETRY_CNT = 1 << 15;
        const RNR_RETRY = 1 << 16;
        /// Outbound depth (initiator depth).
        const MAX_RD_ATOMIC = 1 << 17;
        const PATH_MIG_STATE = 1 << 18;
        /// SQ Drained event request.
        const SQD_EVENT = 1 << 19;
    }
}
