//! The `SHARED` file on a real file system: a `MAP_SHARED` memory map of the file, `fcntl`
//! open-file-description locks (released by the kernel when the process dies, F-08-3) and a
//! futex on the mapped notify word (works across processes: the futex is not private).

use super::{LockMode, SharedFile, SHARED_FILE_BYTES, SHARED_WORDS};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::time::Duration;

/// Byte offset of the notify word (F-08-5).
pub const NOTIFY_BYTE: usize = 96;

/// One open file description of `SHARED`, mapped.
pub struct FsShared {
    file: File,
    map: memmap2::MmapRaw,
}

impl FsShared {
    /// Opens (creating when missing) and maps the shared file at `path`, sized to
    /// [`SHARED_FILE_BYTES`]. A new file reads as zeros: not initialized (F-08-5).
    pub fn open(path: &Path) -> io::Result<FsShared> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        if file.metadata()?.len() < SHARED_FILE_BYTES {
            file.set_len(SHARED_FILE_BYTES)?;
        }
        let map = memmap2::MmapOptions::new()
            .len(usize::try_from(SHARED_FILE_BYTES).map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "shared file larger than memory",
                )
            })?)
            .map_raw(&file)?;
        Ok(FsShared { file, map })
    }

    fn fcntl_lock(&self, offset: u64, kind: libc::c_int, wait: bool) -> io::Result<bool> {
        let start = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "lock offset too large"))?;
        // SAFETY: a zeroed `flock` is a valid value of the plain C struct.
        let mut request: libc::flock = unsafe { std::mem::zeroed() };
        request.l_type = short(kind)?;
        request.l_whence = short(libc::SEEK_SET)?;
        request.l_start = start;
        request.l_len = 1;
        // OFD locks require l_pid = 0.
        request.l_pid = 0;
        let command = if wait {
            libc::F_OFD_SETLKW
        } else {
            libc::F_OFD_SETLK
        };
        loop {
            // SAFETY: fcntl on a descriptor we own with a pointer to a live `flock`.
            let result = unsafe { libc::fcntl(self.file.as_raw_fd(), command, &request) };
            if result == 0 {
                return Ok(true);
            }
            let error = io::Error::last_os_error();
            match error.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) | Some(libc::EACCES) if !wait => return Ok(false),
                _ => return Err(error),
            }
        }
    }
}

impl SharedFile for FsShared {
    fn word(&self, index: usize) -> &AtomicU64 {
        assert!(index < SHARED_WORDS, "shared word {index} out of range");
        // SAFETY: the map is SHARED_FILE_BYTES long and page aligned, so word `index` is in
        // bounds and 8-byte aligned; it lives as long as `self`. Other processes change it
        // only through atomic operations too (F-08-5).
        unsafe { &*(self.map.as_mut_ptr().add(index * 8) as *const AtomicU64) }
    }

    fn notify_word(&self) -> &AtomicU32 {
        // SAFETY: as in `word`; byte 96 is 4-byte aligned and inside the map.
        unsafe { &*(self.map.as_mut_ptr().add(NOTIFY_BYTE) as *const AtomicU32) }
    }

    fn wait_notify(&self, seen: u32, timeout: Duration) {
        let timeout = libc::timespec {
            tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
            tv_nsec: libc::c_long::from(timeout.subsec_nanos()),
        };
        // SAFETY: FUTEX_WAIT (not private: the word is in a shared map) on an aligned u32
        // that lives as long as `self`; the kernel only reads it. A spurious or early
        // return is fine: callers re-check what they wait for.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.notify_word().as_ptr(),
                libc::FUTEX_WAIT,
                seen.to_le(),
                &timeout as *const libc::timespec,
                std::ptr::null::<u32>(),
                0,
            );
        }
    }

    fn wake_all(&self) {
        // SAFETY: FUTEX_WAKE on an aligned u32 of the shared map.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.notify_word().as_ptr(),
                libc::FUTEX_WAKE,
                i32::MAX,
                std::ptr::null::<libc::timespec>(),
                std::ptr::null::<u32>(),
                0,
            );
        }
    }

    fn lock(&self, offset: u64, mode: LockMode, wait: bool) -> io::Result<bool> {
        let kind = match mode {
            LockMode::Shared => libc::F_RDLCK,
            LockMode::Exclusive => libc::F_WRLCK,
        };
        self.fcntl_lock(offset, kind, wait)
    }

    fn unlock(&self, offset: u64) -> io::Result<()> {
        self.fcntl_lock(offset, libc::F_UNLCK, false).map(|_| ())
    }
}

/// A libc constant for a `short` field of `struct flock` (they are small `int`s).
fn short(value: libc::c_int) -> io::Result<libc::c_short> {
    libc::c_short::try_from(value)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "flock field out of range"))
}
