package main

import (
	"fmt"
	"math/rand/v2"

	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/kvbridge/kvbridge/internal/promread"
	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/kvbridge/kvbridge/transfer"
	"github.com/prometheus/client_golang/prometheus"
)

// digestMode: what the end-to-end digest (docs/PROTOCOL.md "Digest")
// costs. The same rooms (one prefill and one decode rank in this process,
// DRAM, the model's pages, contiguous and fragmented), with every room
// asking for a digest against two ranks that ask none, in interleaved
// rounds (both clusters up, one round of each in turn): GB/s and CPU per
// GB, medians of the rounds. Pushed from prefill TP 1 and 2 (the rank
// mapping's pieces: one per head), and pulled. With -mem VRAM both ranks'
// KV is device memory, summed there by the digest kernel (on the CUDA
// double: its C stand-in for the kernel, so a check of the path, not a
// GPU's figure), with cuMemcpyDtoD as each row's reference.
func (b *bench) digestMode() error {
	tokens, iters, rounds := 4096, 6, 5
	if b.quick {
		tokens, iters, rounds = 512, 2, 2
	}
	pt := b.model.PageTokens
	n := tokens / pt
	bytes := float64(tokens) * float64(b.model.BytesPerToken())
	digesting := func(cfg *kvmanager.Config) {
		cfg.Digest = cfg.Role == kvmanager.RoleDecode
		cfg.Registerer = prometheus.NewRegistry() // read back below
	}
	cases := []struct {
		ptp  int
		pull bool
	}{{1, false}, {2, false}, {1, true}}
	steps, total := 0, len(cases)*2*rounds
	for _, tc := range cases {
		ptp := tc.ptp
		var cs [2]*topoCluster
		for i, digest := range []bool{false, true} {
			var mods []func(*kvmanager.Config)
			if digest {
				mods = append(mods, digesting)
			}
			if tc.pull {
				mods = append(mods, func(cfg *kvmanager.Config) { cfg.Pull = cfg.Role == kvmanager.RoleDecode })
			}
			c, err := b.topoClusterPages(ptp, 1, transfer.HND, 2*n, pt, pt, 2*n, mods...)
			if err != nil {
				for _, c := range cs {
					if c != nil {
						c.close()
					}
				}
				return err
			}
			cs[i] = c
		}
		var gbps, cpu [2][]float64
		var err error
		for r := 0; r < rounds && err == nil; r++ {
			for i, c := range cs {
				progress("digest", steps, total)
				rng := rand.New(rand.NewPCG(7, uint64(r)))
				mk := func(kind string) func() error {
					return func() error {
						return c.roomChunks(scatter(kind, n, 2*n, rng), scatter(kind, n, 2*n, rng), max(2048/pt, 1))
					}
				}
				var g, u float64
				if g, u, _, err = timeRooms(iters, bytes, mk("contiguous"), mk("fragmented")); err != nil {
					break
				}
				gbps[i], cpu[i] = append(gbps[i], g), append(cpu[i], u)
				steps++
			}
		}
		checked := counterOf(cs[1].decodes[0], "kvbridge_digest_pages_checked_total")
		bad := counterOf(cs[1].decodes[0], "kvbridge_digest_mismatches_total")
		for _, c := range cs {
			c.close()
		}
		b.freeVRAM() // (-mem VRAM: the ranks' device memory, now that they are closed)
		if err != nil {
			return err
		}
		if checked == 0 || bad != 0 {
			return fmt.Errorf("digest rooms: %v pages checked, %v mismatches", checked, bad)
		}
		way := "push"
		if tc.pull {
			way = "pull"
		}
		row := Row{Mode: "digest", Name: fmt.Sprintf("%s digest %s TP %d→1 HND %d tok", b.model.Name, way, ptp, tokens), Bytes: uint64(bytes),
			Value: median(gbps[1]), Unit: "GB/s", References: map[string]float64{"no digest": median(gbps[0])},
			CPU: median(cpu[1]), CPUUnit: "s/GB", RefCPU: map[string]float64{"no digest": median(cpu[0])}}
		if b.mem == nixl.VRAM { // summed on the device by the digest kernel
			row.Name += b.memSuffix()
			err = b.addDtoD(&row, uint64(bytes), iters)
			b.freeVRAM()
			if err != nil {
				return err
			}
		}
		b.add(row)
	}
	progress("digest", steps, total)
	return nil
}

// counterOf reads a counter of a rank whose Config has its own registry
// (0 when it cannot be read: the caller treats that as nothing counted).
func counterOf(d *kvmanager.Decode, name string) float64 {
	g, ok := d.Config().Registerer.(prometheus.Gatherer)
	if !ok {
		return 0
	}
	v, _ := promread.Value(g, name)
	return v
}
