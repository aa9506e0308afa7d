//! The shared-memory segment of one host's ranks: a file under `/dev/shm` mapped by every rank,
//! holding a header, one control line per rank (its step counter, the futex word the others sleep
//! on, the CPU it last ran on, its call signatures) and each rank's ring of slots.
//!
//! Expected flow: the host's lowest rank [`Segment::create`]s it under a name derived from the job
//! token and a fresh nonce, sends the nonce to the other ranks over their authenticated TCP
//! connections, they [`Segment::attach`], and once every rank has reported back the creator
//! [`Segment::unlink`]s the file, so that nobody can open it afterwards.
//!
//! Guarantees:
//! - Only token holders can find or trust a segment: its name is `HMAC(token, nonce)` (nothing on
//!   the wire names it), it is created exclusively with mode 0600, and its header carries
//!   `HMAC(token, nonce ‖ geometry)`, which [`Segment::attach`] checks before using it.
//! - The whole size is reserved at creation (`posix_fallocate`): a full `/dev/shm` is an error then,
//!   not a `SIGBUS` in the middle of a collective.
//! - The file exists only between creation and the end of the rendezvous; a creator that fails
//!   or drops the segment before [`Segment::unlink`] removes it. (A creator killed in that window
//!   leaves a file of at most a few MiB, named `tandem-*`.)
//!
//! Layout: header (4 KiB) · control lines (128 bytes per rank, rounded to 4 KiB) · slots
//! (`ranks × slots × slot_bytes`, rank-major).

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::time::Duration;

use super::super::auth;
use tandem_util::token::hmac;

const MAGIC: [u8; 8] = *b"TNDMSHM2";
const HEADER_BYTES: usize = 4096;
/// One control line: two cache lines, so neighbours' counters never share a prefetched pair.
const LINE_BYTES: usize = 128;
/// Where a line's signature words start (after the counter, the waiters and the CPU).
const SIGNATURES_AT: usize = 16;
/// Most slots per rank (the line holds a signature word per slot).
pub const MAX_SLOTS: usize = (LINE_BYTES - SIGNATURES_AT) / 8;
const MAC_AT: usize = 24;

/// A mapped segment.
pub struct Segment {
    base: *mut u8,
    len: usize,
    ranks: usize,
    slots: usize,
    slot_bytes: usize,
    /// The file, while this process created it and has not unlinked it yet.
    path: Option<PathBuf>,
}

// SAFETY: the mapping is plain shared memory; every access goes through atomics or through slot
// regions that the collective protocol hands to one writer at a time.
unsafe impl Send for Segment {}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment")
            .field("ranks", &self.ranks)
            .field("slots", &self.slots)
            .field("slot_bytes", &self.slot_bytes)
            .finish()
    }
}

fn lines_bytes(ranks: usize) -> usize {
    (ranks * LINE_BYTES).div_ceil(4096) * 4096
}

fn total_bytes(ranks: usize, slots: usize, slot_bytes: usize) -> usize {
    HEADER_BYTES + lines_bytes(ranks) + ranks * slots * slot_bytes
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn geometry_mac(token: &[u8], nonce: &[u8], ranks: usize, slots: usize, slot_bytes: usize) -> [u8; 32] {
    hmac(
        token,
        &[
            b"tandem-shm-v1/segment",
            nonce,
            &(ranks as u64).to_le_bytes(),
            &(slots as u64).to_le_bytes(),
            &(slot_bytes as u64).to_le_bytes(),
        ],
    )
}

impl Segment {
    /// The file name of the segment for `nonce`: only holders of `token` can compute it.
    pub fn file_name(token: &[u8], nonce: &[u8]) -> String {
        let mac = hmac(token, &[b"tandem-shm-v1/name", nonce]);
        format!("tandem-{}", hex(&mac[..16]))
    }

    /// Creates and maps a segment for `ranks` ranks with `slots` slots of `slot_bytes` each.
    pub fn create(
        dir: &Path,
        token: &[u8],
        nonce: &[u8],
        ranks: usize,
        slots: usize,
        slot_bytes: usize,
    ) -> Result<Self, String> {
        if !(1..=MAX_SLOTS).contains(&slots) || slot_bytes == 0 || !slot_bytes.is_multiple_of(64) {
            return Err(format!(
                "{slots} slots of {slot_bytes} bytes: slots must be 1..={MAX_SLOTS} and the slot size a \
                 positive multiple of 64"
            ));
        }
        let path = dir.join(Self::file_name(token, nonce));
        let len = total_bytes(ranks, slots, slot_bytes);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        let unlink_on_error = |why: String| {
            let _ = std::fs::remove_file(&path);
            why
        };
        // SAFETY: a valid file descriptor; the range is within off_t.
        let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) };
        if rc != 0 {
            return Err(unlink_on_error(format!(
                "cannot reserve {len} bytes in {}: {} (is /dev/shm full or too small? containers \
                 often get 64 MiB)",
                dir.display(),
                std::io::Error::from_raw_os_error(rc)
            )));
        }
        let base = map(&file, len).map_err(unlink_on_error)?;
        let seg = Self { base, len, ranks, slots, slot_bytes, path: Some(path) };
        // SAFETY: the header lies within the fresh, zero-filled mapping that only this process
        // can know about yet.
        unsafe {
            let h = std::slice::from_raw_parts_mut(seg.base, HEADER_BYTES);
            h[..8].copy_from_slice(&MAGIC);
            h[8..16].copy_from_slice(&(ranks as u64).to_le_bytes());
            h[16..20].copy_from_slice(&(slots as u32).to_le_bytes());
            h[20..24].copy_from_slice(&(slot_bytes as u32).to_le_bytes());
            h[MAC_AT..MAC_AT + 32].copy_from_slice(&geometry_mac(token, nonce, ranks, slots, slot_bytes));
        }
        Ok(seg)
    }

    /// Opens and maps the segment another rank created for `nonce`, checking that its creator
    /// held `token` and that the geometry is the announced one.
    pub fn attach(
        dir: &Path,
        token: &[u8],
        nonce: &[u8],
        ranks: usize,
        slots: usize,
        slot_bytes: usize,
    ) -> Result<Self, String> {
        let path = dir.join(Self::file_name(token, nonce));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| {
                format!(
                    "cannot open {} ({e}): the ranks see different /dev/shm file systems (separate \
                     containers or mount namespaces)",
                    path.display()
                )
            })?;
        let len = total_bytes(ranks, slots, slot_bytes);
        let actual = file.metadata().map_err(|e| format!("cannot stat {}: {e}", path.display()))?.len();
        if actual != len as u64 {
            return Err(format!("{} has {actual} bytes where {len} were announced", path.display()));
        }
        let base = map(&file, len)?;
        let seg = Self { base, len, ranks, slots, slot_bytes, path: None };
        // SAFETY: the header lies within the mapping; the creator wrote it before announcing.
        let h = unsafe { std::slice::from_raw_parts(seg.base, HEADER_BYTES) };
        let want = geometry_mac(token, nonce, ranks, slots, slot_bytes);
        let got: &[u8; 32] = h[MAC_AT..MAC_AT + 32].try_into().map_err(|_| "short header".to_owned())?;
        if h[..8] != MAGIC || !auth::macs_equal(got, &want) {
            return Err(format!(
                "{} was not created by a holder of this job's token for this group: refusing it",
                path.display()
            ));
        }
        Ok(seg)
    }

    /// Removes the file (the mappings stay): after this nobody can join.
    pub fn unlink(&mut self) {
        if let Some(path) = self.path.take() {
            let _ = std::fs::remove_file(path);
        }
    }

    /// Number of ranks.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// Slots per rank.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Bytes per slot.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    fn line(&self, rank: usize) -> *mut u8 {
        assert!(rank < self.ranks, "rank {rank} outside a segment of {}", self.ranks);
        // SAFETY: within the lines area of the mapping (checked above).
        unsafe { self.base.add(HEADER_BYTES + rank * LINE_BYTES) }
    }

    /// `rank`'s step counter (the futex word its waiters sleep on).
    pub fn seq(&self, rank: usize) -> &AtomicU32 {
        // SAFETY: 4-aligned (lines are 128-aligned in a page-aligned mapping), within the mapping,
        // and only ever accessed atomically.
        unsafe { &*(self.line(rank) as *const AtomicU32) }
    }

    /// How many ranks sleep on `rank`'s counter.
    pub fn waiters(&self, rank: usize) -> &AtomicU32 {
        // SAFETY: as for `seq`, 4 bytes further.
        unsafe { &*(self.line(rank).add(4) as *const AtomicU32) }
    }

    /// The CPU `rank` ran on when it last stepped (`u32::MAX` when unknown).
    pub fn cpu(&self, rank: usize) -> &AtomicU32 {
        // SAFETY: as for `seq`, 8 bytes further.
        unsafe { &*(self.line(rank).add(8) as *const AtomicU32) }
    }

    /// The call signature `rank` stored with slot `slot`'s first piece.
    pub fn signature(&self, rank: usize, slot: usize) -> &AtomicU64 {
        assert!(slot < self.slots, "slot {slot} outside {}", self.slots);
        // SAFETY: 8-aligned, within the line (slot < MAX_SLOTS), only accessed atomically.
        unsafe { &*(self.line(rank).add(SIGNATURES_AT + 8 * slot) as *const AtomicU64) }
    }

    /// The first element of `rank`'s slot `slot` (`slot_bytes / 4` elements).
    pub fn slot(&self, rank: usize, slot: usize) -> *mut f32 {
        assert!(rank < self.ranks && slot < self.slots, "slot {rank}/{slot} outside the segment");
        let at = HEADER_BYTES + lines_bytes(self.ranks) + (rank * self.slots + slot) * self.slot_bytes;
        // SAFETY: within the mapping; 64-aligned because slot_bytes is a multiple of 64.
        unsafe { self.base.add(at).cast::<f32>() }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        self.unlink();
        // SAFETY: `base`/`len` are the mapping made in `map`, unmapped exactly once here.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

fn map(file: &File, len: usize) -> Result<*mut u8, String> {
    // SAFETY: a fresh shared mapping of a file that is at least `len` bytes long.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(format!("cannot map {len} bytes of shared memory: {}", std::io::Error::last_os_error()));
    }
    Ok(p.cast())
}

/// Sleeps while `word` holds `expected`, at most `timeout` (a futex shared between processes).
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: `word` is a live, aligned u32 in shared memory; the kernel only reads it and `ts`.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        )
    };
}

/// Wakes every process sleeping on `word`.
pub fn futex_wake(word: &AtomicU32) {
    // SAFETY: `word` is a live, aligned u32 in shared memory.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        )
    };
}
