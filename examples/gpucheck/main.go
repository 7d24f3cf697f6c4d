// Command gpucheck checks kvbridge on a GPU node: NVML discovery, device
// allocation, and cross-process VRAM transfers through the ucx engine (CUDA
// IPC), 1 GiB and 4,096 × 32 KiB pages, every byte verified, with bandwidth
// next to cuMemcpyDtoD on the same device in the same run.
//
// It needs no Go toolchain: scripts/gpu-check.sh builds it with its shared
// libraries. Usage: gpucheck [-size BYTES] [-pages N] [-iters N] [-json FILE]
//
// gpucheck -layerwise [-lw-layers N] [-lw-tokens 1024,4096,8192] [-lw-rooms N]
// runs the layer-wise TTFT benchmark on the device instead (layerwise.go).
package main

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/kvbridge/kvbridge/gpu"
	"github.com/kvbridge/kvbridge/internal/cuda"
	"github.com/kvbridge/kvbridge/internal/nixl"
)

type result struct {
	Date          string       `json:"date"`
	Devices       []gpu.Device `json:"devices"`
	DiscoveryErr  string       `json:"discovery_error,omitempty"`
	Driver        int          `json:"cuda_driver_version"`
	BulkBytes     uint64       `json:"bulk_bytes"`
	BulkGBps      float64      `json:"bulk_gbps"`
	PagesGBps     float64      `json:"pages_gbps"`
	DtoDGBps      float64      `json:"dtod_gbps"`
	Ratio         float64      `json:"ratio_bulk_vs_dtod"`
	PagesRatio    float64      `json:"ratio_pages_vs_dtod"`
	BytesVerified uint64       `json:"bytes_verified"`
}

func main() {
	if os.Getenv("KVBRIDGE_GPUCHECK_CHILD") != "" {
		os.Exit(child())
	}
	size := flag.Uint64("size", 1<<30, "bulk transfer size in bytes")
	pages := flag.Int("pages", 4096, "number of 32 KiB pages in the paged transfer")
	iters := flag.Int("iters", 5, "timed repetitions of each transfer")
	jsonOut := flag.String("json", "", "write the result as JSON to this file")
	noNVML := flag.Bool("allow-no-nvml", false, "continue when NVML discovery fails (CUDA driver double)")
	lw := flag.Bool("layerwise", false, "instead: TTFT with each layer sent once its CUDA event completes, vs the whole chunk after the stream drained")
	lwLayers := flag.Int("lw-layers", 32, "layerwise: layers")
	lwTokens := flag.String("lw-tokens", "1024,4096,8192", "layerwise: token counts")
	lwRooms := flag.Int("lw-rooms", 5, "layerwise: rooms of each way per token count (medians)")
	flag.Parse()
	if *lw {
		var tokens []int
		for _, f := range strings.Split(*lwTokens, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n <= 0 {
				fmt.Fprintf(os.Stderr, "gpucheck: -lw-tokens: %q\n", f)
				os.Exit(2)
			}
			tokens = append(tokens, n)
		}
		cases, err := runLayerwise(max(*lwLayers, 1), tokens, max(*lwRooms, 1))
		if err != nil {
			fmt.Fprintln(os.Stderr, "gpucheck: layerwise: FAIL:", err)
			os.Exit(1)
		}
		if *jsonOut != "" {
			b, _ := json.MarshalIndent(cases, "", "  ")
			if err := os.WriteFile(*jsonOut, b, 0o644); err != nil {
				fmt.Fprintln(os.Stderr, "gpucheck:", err)
				os.Exit(1)
			}
		}
		fmt.Println("gpucheck: layerwise OK")
		return
	}
	r, err := run(*size, *pages, *iters, *noNVML)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpucheck: FAIL:", err)
		os.Exit(1)
	}
	if *jsonOut != "" {
		b, _ := json.MarshalIndent(r, "", "  ")
		if err := os.WriteFile(*jsonOut, b, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "gpucheck:", err)
			os.Exit(1)
		}
	}
	fmt.Println("gpucheck: OK")
}

const pageSize = 32 << 10

func run(size uint64, pages, iters int, allowNoNVML bool) (*result, error) {
	r := &result{Date: time.Now().UTC().Format(time.RFC3339), BulkBytes: size}
	devs, err := gpu.Discover()
	if err != nil {
		if !allowNoNVML {
			return nil, fmt.Errorf("discovery: %w", err)
		}
		r.DiscoveryErr = err.Error()
	}
	r.Devices = devs
	for _, d := range devs {
		fmt.Printf("GPU %d: %s %s, %d GiB (%d free), PCI %s, NUMA %d, %d NVLinks\n", d.Index, d.Name, d.UUID,
			d.MemoryTotal>>30, d.MemoryFree>>30, d.PCIBusID, d.NUMANode, len(d.NVLinkPeers))
	}
	drv, err := cuda.OpenDriver(cuda.DriverPathFromEnv())
	if err != nil {
		return nil, err
	}
	r.Driver = drv.Version()
	ctx, err := drv.Primary(0)
	if err != nil {
		return nil, err
	}
	region := size + uint64(pages)*pageSize
	src, err := ctx.Alloc(region)
	if err != nil {
		return nil, fmt.Errorf("allocating %d bytes: %w", region, err)
	}
	defer ctx.Free(src)
	fmt.Printf("allocated 2 × %d MiB of device memory (driver %d)\n", region>>20, r.Driver)
	host := make([]byte, region)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i+8 <= len(host); i += 8 {
		v := rng.Uint64()
		for k := 0; k < 8; k++ {
			host[i+k] = byte(v >> (8 * k))
		}
	}
	if err := ctx.CopyHtoD(src, host); err != nil {
		return nil, err
	}

	// Reference: cuMemcpyDtoD on the same device, same sizes.
	ref, err := ctx.Alloc(size)
	if err != nil {
		return nil, err
	}
	defer ctx.Free(ref)
	start := time.Now()
	for i := 0; i < iters; i++ {
		if err := ctx.CopyDtoD(ref, src, size); err != nil {
			return nil, err
		}
	}
	r.DtoDGBps = float64(size) * float64(iters) / time.Since(start).Seconds() / 1e9

	// The peer process owns the destination VRAM.
	peer, err := startPeer(region)
	if err != nil {
		return nil, err
	}
	defer peer.stop()
	wcfg := nixl.Config{Name: "gpucheck-writer", Engine: nixl.EngineUCX, UCX: map[string]string{"TLS": "posix,cma,self"}}
	wcfg.FromEnv()
	a, err := nixl.Open(wcfg)
	if err != nil {
		return nil, err
	}
	defer a.Close()
	if _, err := a.Register(nixl.VRAM, []nixl.Desc{{Addr: uintptr(src), Len: region}}); err != nil {
		return nil, err
	}
	remote, err := a.LoadRemote(peer.md)
	if err != nil {
		return nil, err
	}

	// 1 GiB in one descriptor.
	bulk, err := transfer(a, remote, []nixl.Desc{{Addr: uintptr(src), Len: size}}, []nixl.Desc{{Addr: peer.addr, Len: size}}, iters)
	if err != nil {
		return nil, fmt.Errorf("bulk: %w", err)
	}
	r.BulkGBps = float64(size) * float64(iters) / bulk.Seconds() / 1e9
	if err := peer.verify(0, host[:size]); err != nil {
		return nil, fmt.Errorf("bulk: %w", err)
	}
	r.BytesVerified += size

	// 4,096 × 32 KiB pages, scattered (page i → page perm[i]).
	perm := rand.New(rand.NewPCG(3, 4)).Perm(pages)
	var ls, rs []nixl.Desc
	want := make([]byte, uint64(pages)*pageSize)
	for i, j := range perm {
		off := size + uint64(i)*pageSize
		ls = append(ls, nixl.Desc{Addr: uintptr(src) + uintptr(off), Len: pageSize})
		rs = append(rs, nixl.Desc{Addr: peer.addr + uintptr(size) + uintptr(j*pageSize), Len: pageSize})
		copy(want[j*pageSize:(j+1)*pageSize], host[off:off+pageSize])
	}
	paged, err := transfer(a, remote, ls, rs, iters)
	if err != nil {
		return nil, fmt.Errorf("pages: %w", err)
	}
	r.PagesGBps = float64(pages*pageSize) * float64(iters) / paged.Seconds() / 1e9
	if err := peer.verify(size, want); err != nil {
		return nil, fmt.Errorf("pages: %w", err)
	}
	r.BytesVerified += uint64(len(want))
	r.Ratio, r.PagesRatio = r.BulkGBps/r.DtoDGBps, r.PagesGBps/r.DtoDGBps
	fmt.Printf("cross-process VRAM write: %d MiB at %.1f GB/s; %d × 32 KiB pages at %.1f GB/s\n",
		size>>20, r.BulkGBps, pages, r.PagesGBps)
	fmt.Printf("cuMemcpyDtoD same device: %.1f GB/s; ratio bulk %.2f, pages %.2f (goal ≥ 0.9)\n",
		r.DtoDGBps, r.Ratio, r.PagesRatio)
	fmt.Printf("verified %d bytes in the peer process\n", r.BytesVerified)
	return r, nil
}

// transfer writes local → remote iters times (each with a notification) and
// returns the total time.
func transfer(a *nixl.Agent, remote string, local, dst []nixl.Desc, iters int) (time.Duration, error) {
	l, err := a.PrepLocal(nixl.VRAM, local)
	if err != nil {
		return 0, err
	}
	r, err := a.PrepRemote(remote, nixl.VRAM, dst)
	if err != nil {
		return 0, err
	}
	idx := make([]int, len(local))
	for i := range idx {
		idx[i] = i
	}
	x, err := a.NewXfer(nixl.Write, l, idx, r, idx, []byte("gpucheck"))
	if err != nil {
		return 0, err
	}
	defer a.Release(x)
	start := time.Now()
	for i := 0; i < iters; i++ {
		if err := a.Post(x); err != nil {
			return 0, err
		}
		if st, err := a.Wait(context.Background(), x); st != nixl.Done {
			return 0, fmt.Errorf("write: %v %v", st, err)
		}
	}
	return time.Since(start), nil
}

type peerProc struct {
	cmd   *exec.Cmd
	in    *bufio.Writer
	inRaw interface{ Close() error }
	out   *bufio.Scanner
	md    []byte
	addr  uintptr
}

func startPeer(size uint64) (*peerProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), fmt.Sprintf("KVBRIDGE_GPUCHECK_CHILD=%d", size))
	cmd.Stderr = os.Stderr
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &peerProc{cmd: cmd, in: bufio.NewWriter(in), inRaw: in, out: bufio.NewScanner(out)}
	p.out.Buffer(make([]byte, 1<<20), 1<<20)
	line, err := p.line()
	if err != nil {
		return nil, err
	}
	f := strings.Fields(line)
	if len(f) != 3 || f[0] != "MD" {
		return nil, fmt.Errorf("peer said %q", line)
	}
	if p.md, err = hex.DecodeString(f[1]); err != nil {
		return nil, err
	}
	var a uint64
	fmt.Sscanf(f[2], "%x", &a)
	p.addr = uintptr(a)
	return p, nil
}

func (p *peerProc) line() (string, error) {
	if !p.out.Scan() {
		return "", errors.New("peer process ended")
	}
	return p.out.Text(), nil
}

// verify asks the peer for the CRC of len(want) bytes at off of its VRAM.
func (p *peerProc) verify(off uint64, want []byte) error {
	fmt.Fprintf(p.in, "CRC %d %d\n", off, len(want))
	p.in.Flush()
	line, err := p.line()
	if err != nil {
		return err
	}
	if exp := fmt.Sprintf("CRC %08x", crc32.ChecksumIEEE(want)); line != exp {
		return fmt.Errorf("peer's VRAM has %s, want %s", line, exp)
	}
	return nil
}

func (p *peerProc) stop() {
	p.inRaw.Close()
	p.cmd.Wait()
}

// child owns the destination VRAM: it prints its metadata, then answers
// "CRC off len" requests by reading its device memory back.
func child() int {
	var size uint64
	fmt.Sscanf(os.Getenv("KVBRIDGE_GPUCHECK_CHILD"), "%d", &size)
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "gpucheck peer:", err); return 1 }
	drv, err := cuda.OpenDriver(cuda.DriverPathFromEnv())
	if err != nil {
		return fail(err)
	}
	ctx, err := drv.Primary(0)
	if err != nil {
		return fail(err)
	}
	dst, err := ctx.Alloc(size)
	if err != nil {
		return fail(err)
	}
	defer ctx.Free(dst)
	pcfg := nixl.Config{Name: "gpucheck-peer", Engine: nixl.EngineUCX, UCX: map[string]string{"TLS": "posix,cma,self"}}
	pcfg.FromEnv()
	a, err := nixl.Open(pcfg)
	if err != nil {
		return fail(err)
	}
	defer a.Close()
	if _, err := a.Register(nixl.VRAM, []nixl.Desc{{Addr: uintptr(dst), Len: size}}); err != nil {
		return fail(err)
	}
	md, err := a.Metadata()
	if err != nil {
		return fail(err)
	}
	fmt.Printf("MD %x %x\n", md, uintptr(dst))
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var off, n uint64
		if _, err := fmt.Sscanf(in.Text(), "CRC %d %d", &off, &n); err != nil {
			return fail(err)
		}
		buf := make([]byte, n)
		if err := ctx.CopyDtoH(buf, dst+cuda.DevicePtr(off)); err != nil {
			return fail(err)
		}
		fmt.Printf("CRC %08x\n", crc32.ChecksumIEEE(buf))
	}
	return 0
}
