//! Shrink: what a smaller volume can hold once its filesystem is made.
//!
//! A new volume of `S` bytes does not hold `S` bytes of files. For ext4 made with `mke2fs`'s
//! defaults (what CSI drivers run, and the local cluster's provisioner) the model below follows
//! `mke2fs.conf` and e2fsprogs 1.47:
//! - below 512 MiB the `small` profile: 1 KiB blocks, one inode per 4 KiB; else 4 KiB blocks, one
//!   inode per 16 KiB; 256-byte inodes, whose tables are allocated up front;
//! - the journal, sized by block count (`ext2fs_default_journal_size`);
//! - group descriptors, bitmaps, the resize reserve and the root directory: measured at 2.0%
//!   (small) and 0.3% (default) of the volume; counted as 2.5% and 1%;
//! - what a non-root workload cannot use: the root reserve (5%) and ext4's reserve for delayed
//!   allocation (2% of the blocks, at most 4096 blocks).
//!
//! Measured against `mkfs.ext4` 1.47.0 at 64 MiB to 4 GiB, the prediction is at most 3% below
//! the available bytes `statfs` reports, never above them.
//!
//! Other filesystems have no model here: the old volume's own ratio of usable to provisioned
//! bytes is applied to the new size when the old volume is a filesystem of its own; otherwise
//! only the headroom rule applies, and the denial or the plan says so.

use crate::build::FsReport;
use crate::plan::quantity::human;

/// `statfs` type name of the ext2/3/4 family.
pub const EXT_FAMILY: &str = "ext2/ext3";

/// What a new volume of a given size can hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usable {
    /// Bytes a non-root workload can fill.
    pub bytes: i128,
    /// Files and directories it can hold, when the filesystem fixes that at creation.
    pub inodes: Option<i128>,
    /// How the figure was reached, for messages.
    pub basis: String,
}

/// What a new volume of `size` bytes holds, for the filesystem `old` reports (measured on the
/// old volume of `old_capacity` bytes); `None` when nothing can be predicted.
pub fn predict(old: &FsReport, old_capacity: i128, size: i128) -> Option<Usable> {
    let total = i128::from(old.block_size) * i128::from(old.blocks);
    // A filesystem of its own: its size is close to (at most) the provisioned capacity. A
    // directory on a shared disk (a host-path provisioner) says nothing about new volumes.
    if old_capacity <= 0 || total > old_capacity || total * 2 < old_capacity {
        return None;
    }
    if old.fs_type == EXT_FAMILY {
        return Some(ext4(size));
    }
    let used = i128::from(old.block_size) * i128::from(old.blocks - old.blocks_free);
    let avail = i128::from(old.block_size) * i128::from(old.blocks_available);
    let ratio_ppm = (used + avail) * 1_000_000 / old_capacity;
    Some(Usable {
        bytes: size * ratio_ppm / 1_000_000,
        inodes: None,
        basis: format!(
            "{}: {}.{}% of the old volume was usable",
            old.fs_type,
            ratio_ppm / 10_000,
            (ratio_ppm / 1_000) % 10
        ),
    })
}

/// ext4 with `mke2fs`'s defaults: see the module documentation.
pub fn ext4(size: i128) -> Usable {
    let small = size < 512 << 20;
    let (block, inode_ratio, other_pct) = if small {
        (1024, 4096, 25)
    } else {
        (4096, 16384, 10)
    };
    let blocks = size / block;
    // Inodes come in whole groups: 1% fewer than the ratio gives covers the rounding.
    let inodes = size / inode_ratio * 99 / 100;
    let inode_tables = size / inode_ratio * 256;
    let journal = journal_blocks(blocks) * block;
    let other = size * other_pct / 1000;
    let root_reserve = blocks * 5 / 100 * block;
    let delalloc_reserve = (blocks * 2 / 100).min(4096) * block;
    let bytes = size - inode_tables - journal - other - root_reserve - delalloc_reserve;
    Usable {
        bytes: bytes.max(0),
        inodes: Some(inodes),
        basis: format!(
            "ext4: inode tables {}, journal {}, metadata {}, root and allocation reserves {}",
            human(inode_tables),
            human(journal),
            human(other),
            human(root_reserve + delalloc_reserve)
        ),
    }
}

/// The smallest whole number of MiB whose ext4 volume ([`ext4`]) lets a workload fill `bytes`
/// (searched by halving: the usable bytes grow with the size, save a step up at 512 MiB).
pub fn ext4_size_holding(bytes: i128) -> i128 {
    const MIB: i128 = 1 << 20;
    let (mut lo, mut hi) = (bytes.max(0) / MIB, (bytes.max(0) / MIB + 64) * 2);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if ext4(mid * MIB).bytes >= bytes {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo * MIB
}

/// e2fsprogs' `ext2fs_default_journal_size`, in blocks (0: no journal).
fn journal_blocks(blocks: i128) -> i128 {
    match blocks {
        b if b < 2048 => 0,
        b if b < 32768 => 1024,
        b if b < 256 * 1024 => 4096,
        b if b < 512 * 1024 => 8192,
        b if b < 4096 * 1024 => 16384,
        b if b < 8192 * 1024 => 32768,
        b if b < 16384 * 1024 => 65536,
        b if b < 32768 * 1024 => 131072,
        _ => 262144,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_smallest_ext4_size_that_holds_the_bytes() {
        for bytes in [1i128, 10 << 20, 100 << 20, 330 << 20, 3 << 30] {
            let size = ext4_size_holding(bytes);
            assert_eq!(size % (1 << 20), 0);
            assert!(ext4(size).bytes >= bytes, "{bytes}: {size}");
            assert!(
                ext4(size - (1 << 20)).bytes < bytes,
                "{bytes}: {size} is not the smallest"
            );
        }
    }

    /// `statfs` of fresh `mkfs.ext4` (e2fsprogs 1.47.0, Debian 12) volumes, mounted: size in
    /// MiB, block size, available blocks (non-root), inodes.
    const MEASURED: &[(i128, i128, i128, i128)] = &[
        (64, 1024, 51437, 16384),
        (128, 1024, 108015, 32768),
        (256, 1024, 218214, 65536),
        (511, 1024, 449681, 130560),
        (512, 4096, 115545, 32768),
        (1024, 4096, 231986, 65536),
        (4096, 4096, 955110, 262144),
    ];

    #[test]
    fn the_ext4_model_never_promises_more_than_mkfs_gives_and_is_close() {
        for &(mib, block, avail, inodes) in MEASURED {
            let real = avail * block;
            let u = ext4(mib << 20);
            assert!(
                u.bytes <= real,
                "{mib} MiB: predicted {} > real {real}",
                u.bytes
            );
            let gap_ppm = (real - u.bytes) * 1_000_000 / real;
            assert!(gap_ppm < 30_000, "{mib} MiB: {gap_ppm} ppm under");
            let predicted = u.inodes.unwrap_or_default();
            assert!(
                predicted <= inodes && predicted * 100 >= inodes * 98,
                "{mib} MiB"
            );
        }
    }

    fn report(fs_type: &str, block_size: i64, blocks: i64, free: i64, avail: i64) -> FsReport {
        FsReport {
            fs_type: fs_type.into(),
            block_size,
            blocks,
            blocks_free: free,
            blocks_available: avail,
            inodes: 1000,
            inodes_free: 900,
        }
    }

    #[test]
    fn an_ext_family_volume_of_its_own_uses_the_model() {
        let old = report(EXT_FAMILY, 4096, 249195, 249189, 231986);
        assert_eq!(predict(&old, 1 << 30, 128 << 20), Some(ext4(128 << 20)));
    }

    #[test]
    fn another_filesystem_of_its_own_scales_the_old_ratio() {
        // 1 GiB xfs: 1000 MiB in the filesystem, 100 MiB used, 880 MiB available: 95.7%.
        let old = report("xfs", 4096, 256_000, 230_400, 225_280);
        let u = predict(&old, 1 << 30, 512 << 20);
        let u = u.unwrap_or_else(|| Usable {
            bytes: 0,
            inodes: None,
            basis: String::new(),
        });
        assert_eq!(u.bytes, (512 << 20) * 957_031 / 1_000_000);
        assert!(u.basis.contains("xfs: 95.7%"), "{}", u.basis);
    }

    #[test]
    fn a_shared_filesystem_predicts_nothing() {
        // A host directory: the filesystem is far larger than the claim.
        let host = report("overlayfs", 4096, 25_000_000, 20_000_000, 19_000_000);
        assert_eq!(predict(&host, 1 << 30, 512 << 20), None);
        let host_ext4 = report(EXT_FAMILY, 4096, 25_000_000, 20_000_000, 19_000_000);
        assert_eq!(predict(&host_ext4, 1 << 30, 512 << 20), None);
        // Or far smaller (not the claim's own).
        let tiny = report("nfs", 4096, 1000, 900, 900);
        assert_eq!(predict(&tiny, 1 << 30, 512 << 20), None);
    }
}
