//! The static-rate helpers of libibverbs: `enum ibv_rate` to and from a multiple of 2.5 Gb/s
//! and a rate in Mb/s. One table; each function is a look-up in it, so a rate with no
//! multiple (the FDR and EDR-based ones) answers -1 / `IBV_RATE_MAX` exactly as rdma-core does.

use std::ffi::c_int;

/// `IBV_RATE_MAX`: what the reverse look-ups answer for a value no rate has.
const IBV_RATE_MAX: c_int = 0;

/// (`enum ibv_rate`, multiple of 2.5 Gb/s or -1, Mb/s) for every rate of rdma-core 44.
const RATES: [(c_int, c_int, c_int); 24] = [
    (2, 1, 2_500),        // 2.5 Gb/s
    (5, 2, 5_000),        // 5
    (3, 4, 10_000),       // 10
    (6, 8, 20_000),       // 20
    (4, 12, 30_000),      // 30
    (7, 16, 40_000),      // 40
    (8, 24, 60_000),      // 60
    (9, 32, 80_000),      // 80
    (10, 48, 120_000),    // 120
    (11, -1, 14_062),     // 14 (FDR lane)
    (12, -1, 56_250),     // 56
    (13, -1, 112_500),    // 112
    (14, -1, 168_750),    // 168
    (15, -1, 25_781),     // 25 (EDR lane)
    (16, -1, 103_125),    // 100
    (17, -1, 206_250),    // 200
    (18, -1, 309_375),    // 300
    (19, 11, 28_125),     // 28
    (20, 20, 53_125),     // 50
    (21, 160, 425_000),   // 400
    (22, 240, 637_500),   // 600
    (23, 320, 850_000),   // 800
    (24, 480, 1_275_000), // 1200
    (IBV_RATE_MAX, -1, -1),
];

fn by_rate(rate: c_int) -> Option<&'static (c_int, c_int, c_int)> {
    RATES.iter().find(|r| r.0 == rate && rate != IBV_RATE_MAX)
}

#[no_mangle]
pub extern "C" fn ibv_rate_to_mult(rate: c_int) -> c_int {
    by_rate(rate).map_or(-1, |r| r.1)
}

#[no_mangle]
pub extern "C" fn mult_to_ibv_rate(mult: c_int) -> c_int {
    RATES.iter().find(|r| r.1 == mult && mult > 0).map_or(IBV_RATE_MAX, |r| r.0)
}

#[no_mangle]
pub extern "C" fn ibv_rate_to_mbps(rate: c_int) -> c_int {
    by_rate(rate).map_or(-1, |r| r.2)
}

#[no_mangle]
pub extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> c_int {
    RATES.iter().find(|r| r.2 == mbps && mbps > 0).map_or(IBV_RATE_MAX, |r| r.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rate_round_trips_and_unknown_values_answer_like_rdma_core() {
        for &(rate, mult, mbps) in &RATES[..23] {
            assert_eq!(ibv_rate_to_mbps(rate), mbps);
            assert_eq!(mbps_to_ibv_rate(mbps), rate);
            assert_eq!(ibv_rate_to_mult(rate), mult);
            if mult > 0 {
                assert_eq!(mult_to_ibv_rate(mult), rate);
            }
        }
        assert_eq!(ibv_rate_to_mult(0), -1);
        assert_eq!(ibv_rate_to_mbps(25), -1);
        assert_eq!(mult_to_ibv_rate(-1), IBV_RATE_MAX);
        assert_eq!(mbps_to_ibv_rate(-1), IBV_RATE_MAX);
        assert_eq!(mbps_to_ibv_rate(1), IBV_RATE_MAX);
    }
}
