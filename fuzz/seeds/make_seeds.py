#!/usr/bin/env python3
"""Writes seed inputs for the decoder fuzz targets from the pages of a real data file.

Usage: make_seeds.py DATA_FILE OUT_DIR
Writes OUT_DIR/{page,header,journal_record}/seed-*: every in-use page of the data file (with
flag byte 1 and 0), the two header slots' first 128 bytes, and commit records holding full,
trimmed and diff images of those pages (the layouts of src/journal/record.rs).
"""
import os, struct, sys, zlib

PAGE = 8192
data = open(sys.argv[1], 'rb').read()
out = sys.argv[2]
for d in ('page', 'header', 'journal_record'):
    os.makedirs(os.path.join(out, d), exist_ok=True)

def put(d, name, b):
    open(os.path.join(out, d, name), 'wb').write(b)

pages = []
for i in range(len(data) // PAGE):
    p = data[i * PAGE:(i + 1) * PAGE]
    if p[4] in range(1, 7):
        pages.append((i, p))
# Page target: flag byte then the page, trailing zeros cut (the target zero-pads).
seen = set()
for i, p in pages:
    if p[4] in seen and len(seen) < 6 and i > 8:
        continue
    seen.add(p[4])
    body = p.rstrip(b'\0')
    put('page', f'kind{p[4]}-p{i}-sealed', b'\x01' + body)
    put('page', f'kind{p[4]}-p{i}', b'\x00' + body)
# Header target: the first 128 bytes of each slot.
put('header', 'both-slots', b'\x00' + data[:128] + data[PAGE:PAGE + 128])
put('header', 'both-slots-sealed', b'\x01' + data[:128] + data[PAGE:PAGE + 128])

def record(kind, no, sid, txn, body):
    h = struct.pack('<4sBBH QQQ Q I', b'OMJR', kind, 1, 0, no, sid, txn, len(body), zlib.crc32(body))
    return h + struct.pack('<I', zlib.crc32(h))

meta = struct.pack('<QQQQ', 3, 4, 40, 300)
leaves = [(i, p) for i, p in pages if p[4] in (2, 3)][:3]
# Full images.
body = meta + struct.pack('<I', len(leaves))
for i, p in leaves:
    body += struct.pack('<QI', i, 1) + p
put('journal_record', 'full', record(1, 1, 7, 9, body) + body)
# Trimmed images: the longest zero run (word aligned) left out.
body = meta + struct.pack('<I', len(leaves))
for i, p in leaves:
    a = len(p[:PAGE].rstrip(b'\0'))
    a = (a + 7) // 8 * 8
    z = p[32:].find(b'\0' * 256)
    a, b = (32 + z, 32 + z + 256) if z >= 0 else (0, 0)
    body += struct.pack('<QIHH', i, 0x80000001, a, b) + p[:a] + p[b:]
put('journal_record', 'trimmed', record(1, 1, 7, 10, body) + body)
# A diff: page 2 of page 3's image with two ranges replaced.
body = meta + struct.pack('<I', 1)
body += struct.pack('<QIQH', 12, 0x80000002, 2, 2)
body += struct.pack('<HH', 0, 32) + leaves[0][1][:32]
body += struct.pack('<HH', 4000, 8) + b'abcdefgh'
put('journal_record', 'diff', record(1, 1, 7, 11, body) + body)
