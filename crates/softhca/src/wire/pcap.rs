//! Classic pcap files (the libpcap format Wireshark and tshark read): a writer
//! for taps on any link and a reader for tests and tools.
//!
//! Time is always a parameter (DESIGN rule 1): the caller passes each
//! record's timestamp as a `Duration` since the Unix epoch (or since the start
//! of a simulation; Wireshark does not mind).

use std::io::{self, Read, Write};
use std::time::Duration;

/// Ethernet II, the link type of every file this module writes.
pub const LINKTYPE_ETHERNET: u32 = 1;
/// Snap length written in the file header: no RoCEv2 frame is longer.
pub const DEFAULT_SNAPLEN: u32 = 65_535;
/// The largest record the reader accepts, whatever the file's snap length
/// says, so a corrupt length cannot make it allocate gigabytes.
pub const MAX_RECORD_LEN: u32 = 256 * 1024;

const MAGIC_MICROS: u32 = 0xa1b2_c3d4;
const MAGIC_NANOS: u32 = 0xa1b2_3c4d;

/// Why a pcap stream cannot be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PcapError {
    #[error(transparent)]
    Io(#[from] io::Error),
    /// The first 4 bytes are no pcap magic number in either byte order.
    #[error("not a pcap file (magic {0:#010x})")]
    BadMagic(u32),
    /// The stream ends inside a header or record.
    #[error("truncated pcap file")]
    Truncated,
    /// A record claims more bytes than [`MAX_RECORD_LEN`].
    #[error("pcap record of {0} bytes is too large")]
    RecordTooLarge(u32),
}

/// Writes a classic pcap stream with microsecond timestamps.
#[derive(Debug)]
pub struct PcapWriter<W: Write> {
    out: W,
}

impl<W: Write> PcapWriter<W> {
    /// Writes the file header (little-endian, version 2.4, Ethernet).
    pub fn new(out: W) -> io::Result<Self> {
        Self::with_linktype(out, LINKTYPE_ETHERNET)
    }

    /// As [`new`](Self::new) with another link type (e.g. 101 for raw IP).
    pub fn with_linktype(mut out: W, linktype: u32) -> io::Result<Self> {
        let mut h = [0u8; 24];
        h[0..4].copy_from_slice(&MAGIC_MICROS.to_le_bytes());
        h[4..6].copy_from_slice(&2u16.to_le_bytes());
        h[6..8].copy_from_slice(&4u16.to_le_bytes());
        // thiszone and sigfigs stay 0.
        h[16..20].copy_from_slice(&DEFAULT_SNAPLEN.to_le_bytes());
        h[20..24].copy_from_slice(&linktype.to_le_bytes());
        out.write_all(&h)?;
        Ok(PcapWriter { out })
    }

    /// Appends one record. Seconds beyond the 32-bit field wrap, as in every
    /// classic pcap writer.
    pub fn write_packet(&mut self, timestamp: Duration, data: &[u8]) -> io::Result<()> {
        let len =
            u32::try_from(data.len()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "record too large"))?;
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&(timestamp.as_secs() as u32).to_le_bytes());
        h[4..8].copy_from_slice(&timestamp.subsec_micros().to_le_bytes());
        h[8..12].copy_from_slice(&len.to_le_bytes());
        h[12..16].copy_from_slice(&len.to_le_bytes());
        self.out.write_all(&h)?;
        self.out.write_all(data)
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    pub fn get_ref(&self) -> &W {
        &self.out
    }

    pub fn into_inner(self) -> W {
        self.out
    }
}

/// One record of a pcap file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PcapRecord {
    /// Timestamp since the epoch of the capture.
    pub timestamp: Duration,
    /// Length of the packet on the wire (may exceed `data.len()` if the
    /// capture was cut at the snap length).
    pub orig_len: u32,
    pub data: Vec<u8>,
}

/// Reads a classic pcap stream in either byte order, with microsecond or
/// nanosecond timestamps.
#[derive(Debug)]
pub struct PcapReader<R: Read> {
    input: R,
    big_endian: bool,
    nanos: bool,
    linktype: u32,
    snaplen: u32,
}

/// Reads exactly `buf.len()` bytes; `Ok(false)` on a clean end of stream
/// before the first byte, [`PcapError::Truncated`] on one inside.
fn read_full<R: Read>(input: &mut R, buf: &mut [u8]) -> Result<bool, PcapError> {
    let mut got = 0;
    while got < buf.len() {
        match input.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(PcapError::Truncated),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(true)
}

impl<R: Read> PcapReader<R> {
    /// Reads and checks the file header.
    pub fn new(mut input: R) -> Result<Self, PcapError> {
        let mut h = [0u8; 24];
        if !read_full(&mut input, &mut h)? {
            return Err(PcapError::Truncated);
        }
        let magic_le = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
        let magic_be = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
        let (big_endian, nanos) = match (magic_le, magic_be) {
            (MAGIC_MICROS, _) => (false, false),
            (MAGIC_NANOS, _) => (false, true),
            (_, MAGIC_MICROS) => (true, false),
            (_, MAGIC_NANOS) => (true, true),
            _ => return Err(PcapError::BadMagic(magic_be)),
        };
        let mut r = PcapReader { input, big_endian, nanos, linktype: 0, snaplen: 0 };
        r.snaplen = r.u32_of(&h[16..20]);
        r.linktype = r.u32_of(&h[20..24]);
        Ok(r)
    }

    fn u32_of(&self, b: &[u8]) -> u32 {
        let a = [b[0], b[1], b[2], b[3]];
        if self.big_endian {
            u32::from_be_bytes(a)
        } else {
            u32::from_le_bytes(a)
        }
    }

    /// The file's link type (1 = Ethernet).
    pub fn linktype(&self) -> u32 {
        self.linktype
    }

    pub fn snaplen(&self) -> u32 {
        self.snaplen
    }

    /// The next record, or `None` at the end of the stream.
    pub fn next_record(&mut self) -> Result<Option<PcapRecord>, PcapError> {
        let mut h = [0u8; 16];
        if !read_full(&mut self.input, &mut h)? {
            return Ok(None);
        }
        let secs = self.u32_of(&h[0..4]);
        let frac = self.u32_of(&h[4..8]);
        let incl_len = self.u32_of(&h[8..12]);
        let orig_len = self.u32_of(&h[12..16]);
        if incl_len > MAX_RECORD_LEN {
            return Err(PcapError::RecordTooLarge(incl_len));
        }
        let mut data = vec![0u8; incl_len as usize];
        if !read_full(&mut self.input, &mut data)? && incl_len > 0 {
            return Err(PcapError::Truncated);
        }
        // A corrupt fraction of a second may exceed one second; Duration
        // carries it over rather than failing.
        let timestamp = if self.nanos {
            Duration::from_secs(u64::from(secs)) + Duration::from_nanos(u64::from(frac))
        } else {
            Duration::from_secs(u64::from(secs)) + Duration::from_micros(u64::from(frac))
        };
        Ok(Some(PcapRecord { timestamp, orig_len, data }))
    }
}

impl<R: Read> Iterator for PcapReader<R> {
    type Item = Result<PcapRecord, PcapError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_record().transpose()
    }
}
