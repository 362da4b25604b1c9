//! The envelope's CRC-32 over one update frame of the digits head (134 KB): the byte-wise
//! table against the slice-by-16 tables fedge uses, side by side.
//!
//! `cargo bench --workspace --bench crc` (BENCHMARKS.md).

use criterion::{Criterion, Throughput, criterion_group, criterion_main};

const BYTEWISE: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC);
const SLICE16: crc::Crc<u32, crc::Table<16>> =
    crc::Crc::<u32, crc::Table<16>>::new(&crc::CRC_32_ISO_HDLC);

fn crc(c: &mut Criterion) {
    let frame: Vec<u8> = (0..134_000u32).map(|i| (i * 31 % 251) as u8).collect();
    assert_eq!(BYTEWISE.checksum(&frame), SLICE16.checksum(&frame));
    let mut group = c.benchmark_group("crc32_134KB");
    group.throughput(Throughput::Bytes(frame.len() as u64));
    group.bench_function("bytewise_table", |b| b.iter(|| BYTEWISE.checksum(&frame)));
    group.bench_function("slice_by_16", |b| b.iter(|| SLICE16.checksum(&frame)));
    group.finish();
}

criterion_group!(benches, crc);
criterion_main!(benches);
