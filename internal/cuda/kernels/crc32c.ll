; kvbridge's device kernels (internal/cuda: the end-to-end digest over
; KV in VRAM, docs/PROTOCOL.md "Digest"). crc32c.ptx is generated from
; this file by `make ptx` (LLVM's llc, NVPTX back end, sm_60, PTX 6.0 —
; loaded by any driver since CUDA 9 and JIT-compiled for the device).
; llc: LLVM version 14.0.6 (another version may write other PTX).
;
; kvb_crc32c_groups(pieces, ends, ngroups, out): one thread per group g <
; ngroups writes out[g], the CRC-32C (Castagnoli, reflected, initial value
; and final inversion 0xffffffff) of the bytes of pieces ends[g-1] ..
; ends[g]-1 (ends[-1] = 0), in order; a piece is an (address, length)
; pair of u64 in device memory. Byte at a time, the polynomial's eight
; shifts branch-free: one thread sums one page, the pages in parallel.

target datalayout = "e-i64:64-i128:128-v16:16-v32:32-n16:32:64"
target triple = "nvptx64-nvidia-cuda"

; crc_group is the CRC-32C of pieces [start, end).
define i32 @crc_group(i64* %pieces, i64 %start, i64 %end) {
entry:
  br label %piece
piece:
  %i = phi i64 [ %start, %entry ], [ %i.next, %piece.done ]
  %crc = phi i32 [ -1, %entry ], [ %c, %piece.done ]
  %more = icmp ult i64 %i, %end
  br i1 %more, label %piece.body, label %finish
piece.body:
  %ai = shl i64 %i, 1
  %aptr = getelementptr i64, i64* %pieces, i64 %ai
  %addr = load i64, i64* %aptr, align 8
  %lptr = getelementptr i64, i64* %aptr, i64 1
  %len = load i64, i64* %lptr, align 8
  %p0 = inttoptr i64 %addr to i8*
  br label %byte
byte:
  %k = phi i64 [ 0, %piece.body ], [ %k.next, %byte.body ]
  %c = phi i32 [ %crc, %piece.body ], [ %c8, %byte.body ]
  %bmore = icmp ult i64 %k, %len
  br i1 %bmore, label %byte.body, label %piece.done
byte.body:
  %bp = getelementptr i8, i8* %p0, i64 %k
  %b = load i8, i8* %bp, align 1
  %bz = zext i8 %b to i32
  %c0 = xor i32 %c, %bz
  %m1 = and i32 %c0, 1
  %n1 = sub i32 0, %m1
  %q1 = and i32 %n1, -2097792136
  %s1 = lshr i32 %c0, 1
  %c1 = xor i32 %s1, %q1
  %m2 = and i32 %c1, 1
  %n2 = sub i32 0, %m2
  %q2 = and i32 %n2, -2097792136
  %s2 = lshr i32 %c1, 1
  %c2 = xor i32 %s2, %q2
  %m3 = and i32 %c2, 1
  %n3 = sub i32 0, %m3
  %q3 = and i32 %n3, -2097792136
  %s3 = lshr i32 %c2, 1
  %c3 = xor i32 %s3, %q3
  %m4 = and i32 %c3, 1
  %n4 = sub i32 0, %m4
  %q4 = and i32 %n4, -2097792136
  %s4 = lshr i32 %c3, 1
  %c4 = xor i32 %s4, %q4
  %m5 = and i32 %c4, 1
  %n5 = sub i32 0, %m5
  %q5 = and i32 %n5, -2097792136
  %s5 = lshr i32 %c4, 1
  %c5 = xor i32 %s5, %q5
  %m6 = and i32 %c5, 1
  %n6 = sub i32 0, %m6
  %q6 = and i32 %n6, -2097792136
  %s6 = lshr i32 %c5, 1
  %c6 = xor i32 %s6, %q6
  %m7 = and i32 %c6, 1
  %n7 = sub i32 0, %m7
  %q7 = and i32 %n7, -2097792136
  %s7 = lshr i32 %c6, 1
  %c7 = xor i32 %s7, %q7
  %m8 = and i32 %c7, 1
  %n8 = sub i32 0, %m8
  %q8 = and i32 %n8, -2097792136
  %s8 = lshr i32 %c7, 1
  %c8 = xor i32 %s8, %q8
  %k.next = add i64 %k, 1
  br label %byte
piece.done:
  %i.next = add i64 %i, 1
  br label %piece
finish:
  %r = xor i32 %crc, -1
  ret i32 %r
}

; (kernel)
define void @kvb_crc32c_groups(i64* %pieces, i64* %ends, i64 %ngroups, i32* %out) {
entry:
  %ctaid = call i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()
  %ntid = call i32 @llvm.nvvm.read.ptx.sreg.ntid.x()
  %tid = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %c64 = zext i32 %ctaid to i64
  %n64 = zext i32 %ntid to i64
  %t64 = zext i32 %tid to i64
  %base = mul i64 %c64, %n64
  %g = add i64 %base, %t64
  %in = icmp ult i64 %g, %ngroups
  br i1 %in, label %work, label %done
work:
  %first = icmp eq i64 %g, 0
  br i1 %first, label %have, label %prev
prev:
  %gm1 = sub i64 %g, 1
  %pp = getelementptr i64, i64* %ends, i64 %gm1
  %pv = load i64, i64* %pp, align 8
  br label %have
have:
  %start = phi i64 [ 0, %work ], [ %pv, %prev ]
  %ep = getelementptr i64, i64* %ends, i64 %g
  %end = load i64, i64* %ep, align 8
  %sum = call i32 @crc_group(i64* %pieces, i64 %start, i64 %end)
  %op = getelementptr i32, i32* %out, i64 %g
  store i32 %sum, i32* %op, align 4
  br label %done
done:
  ret void
}

declare i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()
declare i32 @llvm.nvvm.read.ptx.sreg.ntid.x()
declare i32 @llvm.nvvm.read.ptx.sreg.tid.x()

!nvvm.annotations = !{!0}
!0 = !{void (i64*, i64*, i64, i32*)* @kvb_crc32c_groups, !"kernel", i32 1}
