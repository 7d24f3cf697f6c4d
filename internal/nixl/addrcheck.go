package nixl

/*
#include <sys/ipc.h>
#include <sys/shm.h>
#include <unistd.h>

// kvb_shm_size returns the size of SysV segment shmid and its creator's
// pid, or -1 (errno set) when it does not exist or this process may not
// read its attributes.
static long long kvb_shm_size(int shmid, int *cpid, int *rw) {
	struct shmid_ds ds;
	if (shmctl(shmid, IPC_STAT, &ds) != 0) {
		return -1;
	}
	*cpid = ds.shm_cpid;
	// shmat(shmid, NULL, 0) needs read and write permission: this uid's,
	// as the segment's owner or creator.
	*rw = (ds.shm_perm.uid == geteuid() || ds.shm_perm.cuid == geteuid()) && (ds.shm_perm.mode & 0600) == 0600;
	return (long long)ds.shm_segsz;
}

// kvb_shm_peek reads the 32-bit value at off of SysV segment shmid
// (attached read-only for the read); 0 on success.
static int kvb_shm_peek(int shmid, size_t off, unsigned *v) {
	void *p = shmat(shmid, NULL, SHM_RDONLY);
	if (p == (void *)-1) {
		return -1;
	}
	*v = *(volatile unsigned *)((char *)p + off);
	shmdt(p);
	return 0;
}
*/
import "C"

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"regexp"
	"strings"
)

// Validation of a peer's UCX worker address and packed remote keys before
// UCX sees them. UCX parses both without knowing their length and
// trusts every field: a flipped bit in a length walks its parser off the end
// of the buffer, a flipped flag makes a transport assert (posix's
// "dir != NULL" in ucp_ep_create), a changed segment id makes it map a file
// shorter than what it then touches (SIGBUS), another process's file or
// SysV segment, or a length of 0 (posix's "length > 0"). So every address is
// walked here exactly as ucp_address_unpack walks it (src/ucp/wireup/
// address.c, UCX 1.13 to 1.22: address formats v1 and v2, the 1.19
// release-version trailer and md-index legacy bits), every length is checked
// against the bytes there are and must account for all of them, and the
// entries of the transports this process runs — the only ones UCX hands to a
// transport's own parser — are checked as that transport reads them:
//
//   - every one: the priority and capability bits one of this process's own
//     entries for the transport has (a peer of the same UCX release and
//     transport settings packs the same; tcp's priority is 0 on a host's
//     default interface and 1 on the others), finite positive bandwidth and
//     latencies, one
//     path, an md index below 64 that serves one transport only.
//   - self: no device address, an 8-byte interface id.
//   - tcp: device address {flags, sa_family, in_addr | in6_addr | local id and
//     network namespace} of the size its flags and family give, interface
//     address a non-zero port.
//   - posix, sysv, cma: the shared-memory device address (system id, and the
//     IPC namespace exactly when the id's flag says so).
//   - posix: the FIFO's segment id names /proc/<pid>/fd/<fd> (USE_PROC_LINK)
//     or /dev/shm/ucx_shm_posix_<id>, never a directory path or a huge-page
//     segment; that file must be a UCX posix segment, open read-write as
//     UCX opens it, exactly this process's own FIFO's size (UCX maps the
//     peer's FIFO with its own FIFO's size), and name at its owner-pid field
//     the process it belongs to.
//   - sysv: the FIFO's shmid must exist, be this user's to attach, be
//     exactly this process's FIFO size and name its creator as its owner.
//   - cma: the pid (and PID namespace, as flagged) of a live process.
//   - all the pids an address names (cma, posix link, FIFO owners, sysv
//     creators) must be one process.
//
// Entries of transports this process does not run are never passed to a
// transport by UCX: they are walked, nothing more. A transport this process
// runs that this file does not model (InfiniBand, CUDA IPC, ...) must have
// the capabilities and the address sizes of this process's own entries for
// it; what its fields say is not checked here (UCX asserts on them or
// reads them within its own buffers: what a mutated address did, seen on
// UCX 1.13 and 1.19, is in docs/PROTOCOL.md's table of refusals).
// Endpoint addresses (never in a worker address), AM-only addresses, unified
// mode (another format; refused at Open) and an address naming this worker
// itself are refused.
//
// Remote keys (ucp_ep_rkey_unpack) are checked the same way: md map (only
// mds the address has), memory type (host: the ucx engine packs UCX keys for
// DRAM only), one length-prefixed key per md bit and nothing after but an
// unknown system device, and for each md of a modelled transport the
// transport's key: posix {seg_id, address, length} (the file as above, held
// by the process the address names, the length that of the file rounded up
// to a page), sysv {shmid, address} (this user's segment, created by that
// process, starting at the region and no more than a huge page larger),
// none for self, cma and tcp. Every region a key maps must lie inside the
// memory the key maps, so a direct copy into the mapping never leaves it.
//
// A peer that is an agent of this process (its uuid, or an entry one of
// this process's agents wrote, or this pid) must be exactly that agent: its
// own entries, and regions and keys exactly as it registered them (a write
// through a wrong one would land in this process's own memory; see
// UCXAddress.InProcess).

// UCXVersion is a libucp release.
type UCXVersion struct{ Major, Minor, Release uint }

func (v UCXVersion) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Release) }

// nsLen is the size of a system namespace (ucs_sys_ns_t) in the addresses
// of release v: ino_t up to 1.21, uint32_t from 1.22 on (the tcp loopback
// device, a shared-memory device with its namespace, cma's and posix's
// pid namespace).
func (v UCXVersion) nsLen() int {
	if v.Major > 1 || (v.Major == 1 && v.Minor >= 22) {
		return 4
	}
	return 8
}

// parseUCXVersion reads "1.13.1".
func parseUCXVersion(s string) (UCXVersion, bool) {
	var v UCXVersion
	n, err := fmt.Sscanf(s, "%d.%d.%d", &v.Major, &v.Minor, &v.Release)
	return v, err == nil && n == 3 && fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Release) == s
}

// UCX's address constants (address.c, ucp_types.h).
const (
	ucpObjV1 = 0 // UCP_OBJECT_VERSION_V1
	ucpObjV2 = 1

	ucpHdrFlagDebugInfo  = 1 << 0
	ucpHdrFlagWorkerUUID = 1 << 1
	ucpHdrFlagClientID   = 1 << 2
	ucpHdrFlagAMOnly     = 1 << 3

	ucpAddrFlagLast     = 0x80
	ucpAddrFlagHasEP    = 0x40
	ucpAddrFlagNumPaths = 0x40
	ucpAddrFlagSysDev   = 0x20
	ucpIfaceLenMask     = 0xff ^ (ucpAddrFlagHasEP | ucpAddrFlagLast)                        // 0x3f
	ucpDeviceLenMask    = 0xff ^ (ucpAddrFlagSysDev | ucpAddrFlagNumPaths | ucpAddrFlagLast) // 0x1f
	ucpMDEmptyDev       = 0x80
	ucpMDMaskV1Legacy   = 0x1f // UCX < 1.19, address v1: alloc and reg flags in bits 5 and 6
	ucpMDMask           = 0x7f
	ucpMDLegacyBits     = 0x60
	ucpNullResource     = 0xff
	ucpMaxResources     = 128
	ucpMaxMDs           = 64
	ucpMaxSysDevs       = 64 // a UCS_BIT(sys_dev) must not overflow
	ucsSysDevUnknown    = 0xff
	ucpRelVerBits       = 4
	ucpIfaceAttrV1Size  = 16 // overhead, bandwidth, lat_ovh (float32), prio_cap_flags (u32)
	ucpIfaceAttrV2Size  = 8  // overhead, bandwidth, latency (fp8), prio, seg_size, flags (u16)
	uctLocalAddrFlagNS  = uint64(1) << 63
	uctCMAAddrFlagPIDNS = uint32(1) << 31

	posixSegProcfs  = uint64(1) << 63
	posixSegShmOpen = uint64(1) << 62
	posixSegHugeTLB = uint64(1) << 61
	posixSegPIDNS   = uint64(1) << 60
	posixSegFlags   = posixSegProcfs | posixSegShmOpen | posixSegHugeTLB | posixSegPIDNS
	// mmFIFOPIDOffset is where uct_mm_fifo_ctl_t keeps the FIFO owner's
	// pid (head, signal_addrlen, sockaddr_un, padded to a cache line; then
	// tail, pid): the same in UCX 1.13 to 1.22, checked against this
	// process's own FIFO at each agent's start.
	mmFIFOPIDOffset  = 136
	sysvSlack        = 2 << 20 // a sysv segment is at most a huge page over its region
	posixProcfsBits  = 30
	posixRkeySize    = 24 // seg_id, address, length
	sysvRkeySize     = 12 // shmid (u32), owner address
	ucsMemTypeHost   = 0
	afINET, afINET6  = 2, 10
	linuxPIDMaxLimit = 1 << 22
)

// ucsCRC16 is ucs_crc16_string: UCX names transports in addresses by it.
func ucsCRC16(s string) uint16 {
	crc := uint16(0xffff)
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i])
		for b := 0; b < 8; b++ {
			if crc&1 != 0 {
				crc = crc>>1 ^ 0x8408
			} else {
				crc >>= 1
			}
		}
	}
	return ^crc
}

// The transports whose addresses and keys this file checks.
var ucxChecked = map[uint16]string{
	ucsCRC16("self"): "self", ucsCRC16("tcp"): "tcp", ucsCRC16("posix"): "posix",
	ucsCRC16("sysv"): "sysv", ucsCRC16("cma"): "cma",
}

// ucxIface is one transport entry of a packed address.
type ucxIface struct {
	csum uint16
	attr []byte // packed interface attributes
	addr []byte // interface address
}

// ucxDevice is one device of a packed address and its transports.
type ucxDevice struct {
	md     int
	empty  bool
	addr   []byte
	paths  int
	sysDev int
	ifaces []ucxIface
}

// UCXAddress is a packed UCX worker address, walked.
type UCXAddress struct {
	version int // ucpObjV1 or ucpObjV2
	header  []byte
	flags   byte
	uuid    uint64
	hasUUID bool
	devices []ucxDevice
	// peerPID is the process the address's shared-memory entries name
	// (cma's pid, posix's /proc link, sysv's creator), 0 when none does;
	// set by CheckAddress, which requires them to agree.
	peerPID int
}

// parseUCXAddress walks a worker address as ucp_address_unpack of UCX
// release v does (non-unified mode, the flags ucp_ep_create unpacks with),
// checking every length against b; it returns an error for anything UCX
// would read outside b, or that a worker address never holds.
func parseUCXAddress(b []byte, v UCXVersion) (*UCXAddress, error) {
	r := &addrReader{b: b}
	a, err := r.header()
	if err != nil {
		return nil, err
	}
	if err := r.need(1, "device list"); err != nil {
		return nil, err
	}
	if b[r.off] == ucpNullResource {
		r.off++
		if r.off != len(b) {
			return nil, fmt.Errorf("%d bytes after an empty device list", len(b)-r.off)
		}
		return a, nil
	}
	r.version, r.newMD = a.version, v.Major > 1 || v.Minor >= 19
	dstVersion := 0 // the peer's minor release, when it packs it (1.19+)
	for last := false; !last; {
		if len(a.devices) >= ucpMaxResources {
			return nil, fmt.Errorf("more than %d devices", ucpMaxResources)
		}
		var d ucxDevice
		if d, last, err = r.device(len(a.devices)); err != nil {
			return nil, err
		}
		if d.empty && last && r.newMD {
			dstVersion = d.md & (1<<ucpRelVerBits - 1)
		}
		a.devices = append(a.devices, d)
	}
	if r.off != len(b) {
		return nil, fmt.Errorf("%d bytes after the last device", len(b)-r.off)
	}
	// ucp_address_adjust_unpacked_md_index (1.19+): a v1 address of a
	// release before 1.19 still has the legacy bits in its md indices.
	if r.newMD && a.version == ucpObjV1 && unpackReleaseVersion(v, dstVersion) <= 18 {
		for i := range a.devices {
			a.devices[i].md &^= ucpMDLegacyBits
		}
	}
	for i, d := range a.devices {
		if !d.empty && d.md >= ucpMaxMDs {
			return nil, fmt.Errorf("device %d: md index %d (at most %d)", i, d.md, ucpMaxMDs-1)
		}
	}
	return a, nil
}

// addrReader reads a packed worker address front to back; every read
// checks the bytes are there first.
type addrReader struct {
	b       []byte
	off     int
	version int  // the address's format, once its header is read
	newMD   bool // the local UCX unpacks md indices as 1.19+ does
	ifaces  int  // transport addresses read so far, in all devices
}

// need checks that n more bytes are left for what.
func (r *addrReader) need(n int, what string) error {
	if n < 0 || len(r.b)-r.off < n {
		return fmt.Errorf("%s at byte %d: %d bytes left, %d needed", what, r.off, len(r.b)-r.off, n)
	}
	return nil
}

// u8 reads one byte.
func (r *addrReader) u8(what string) (int, error) {
	if err := r.need(1, what); err != nil {
		return 0, err
	}
	r.off++
	return int(r.b[r.off-1]), nil
}

// extended reads a value under mask; in a v2 address, an all-ones value
// means the next byte holds it.
func (r *addrReader) extended(mask int, what string) (int, error) {
	x, err := r.u8(what)
	if err != nil {
		return 0, err
	}
	x &= mask
	if r.version != ucpObjV1 && x == mask {
		return r.u8(what + " (extended)")
	}
	return x, nil
}

// header reads the address's header: format, flags, worker uuid, client
// id and worker name.
func (r *addrReader) header() (*UCXAddress, error) {
	b := r.b
	a := &UCXAddress{}
	if err := r.need(1, "header"); err != nil {
		return nil, err
	}
	a.version = int(b[0] & 0xf)
	switch a.version {
	case ucpObjV1:
		a.flags = b[0] >> 4
		r.off = 1
	case ucpObjV2:
		if err := r.need(2, "header"); err != nil {
			return nil, err
		}
		a.flags = b[1]
		r.off = 2
	default:
		return nil, fmt.Errorf("address format %d (UCX knows v1 and v2 only, and asserts on others)", a.version+1)
	}
	a.header = b[:r.off]
	if a.flags&^(ucpHdrFlagDebugInfo|ucpHdrFlagWorkerUUID|ucpHdrFlagClientID|ucpHdrFlagAMOnly) != 0 {
		return nil, fmt.Errorf("unknown address flags %#x", a.flags)
	}
	if a.flags&ucpHdrFlagAMOnly != 0 {
		return nil, fmt.Errorf("an AM-only address (not a worker address)")
	}
	// ucp_ep_create unpacks with UCP_ADDRESS_PACK_FLAG_WORKER_UUID: a v1
	// address always has it.
	if a.version == ucpObjV1 || a.flags&ucpHdrFlagWorkerUUID != 0 {
		if err := r.need(8, "worker uuid"); err != nil {
			return nil, err
		}
		a.uuid, a.hasUUID = binary.LittleEndian.Uint64(b[r.off:]), true
		r.off += 8
	}
	if a.flags&ucpHdrFlagClientID != 0 {
		if err := r.need(8, "client id"); err != nil {
			return nil, err
		}
		r.off += 8
	}
	if a.flags&ucpHdrFlagDebugInfo != 0 {
		n, err := r.u8("worker name length")
		if err != nil {
			return nil, err
		}
		if err := r.need(n, "worker name"); err != nil {
			return nil, err
		}
		r.off += n
	}
	return a, nil
}

// device reads device i: its md index, address, paths, system device and
// transports; last: it is the address's last device.
func (r *addrReader) device(i int) (d ucxDevice, last bool, err error) {
	b := r.b
	if err := r.need(1, "device md index"); err != nil {
		return d, false, err
	}
	d.empty = b[r.off]&ucpMDEmptyDev != 0
	mask := ucpMDMask
	if r.version == ucpObjV1 && !r.newMD {
		mask = ucpMDMaskV1Legacy
	}
	if d.md, err = r.extended(mask, "device md index"); err != nil {
		return d, false, err
	}
	if err := r.need(1, "device address length"); err != nil {
		return d, false, err
	}
	flags := int(b[r.off]) &^ ucpDeviceLenMask
	last = flags&ucpAddrFlagLast != 0
	n, err := r.extended(ucpDeviceLenMask, "device address length")
	if err != nil {
		return d, false, err
	}
	d.paths, d.sysDev = 1, ucsSysDevUnknown
	if flags&ucpAddrFlagNumPaths != 0 {
		if d.paths, err = r.u8("device path count"); err != nil {
			return d, false, err
		}
		if d.paths == 0 {
			return d, false, fmt.Errorf("device %d: zero paths", i)
		}
	}
	if flags&ucpAddrFlagSysDev != 0 {
		if d.sysDev, err = r.u8("device system id"); err != nil {
			return d, false, err
		}
		if d.sysDev != ucsSysDevUnknown && d.sysDev >= ucpMaxSysDevs {
			return d, false, fmt.Errorf("device %d: system device %d (at most %d)", i, d.sysDev, ucpMaxSysDevs-1)
		}
	}
	if err := r.need(n, "device address"); err != nil {
		return d, false, err
	}
	d.addr = b[r.off : r.off+n]
	r.off += n
	for lastTL := d.empty; !lastTL; {
		if r.ifaces >= ucpMaxResources {
			return d, false, fmt.Errorf("more than %d transport addresses", ucpMaxResources)
		}
		r.ifaces++
		var t ucxIface
		if t, lastTL, err = r.iface(); err != nil {
			return d, false, err
		}
		d.ifaces = append(d.ifaces, t)
	}
	return d, last, nil
}

// iface reads one transport address of a device: name checksum,
// attributes, address; lastTL: it is the device's last.
func (r *addrReader) iface() (t ucxIface, lastTL bool, err error) {
	b := r.b
	if err := r.need(2, "transport name checksum"); err != nil {
		return t, false, err
	}
	t.csum = binary.LittleEndian.Uint16(b[r.off:])
	r.off += 2
	attrLen := ucpIfaceAttrV1Size
	if r.version != ucpObjV1 {
		attrLen = ucpIfaceAttrV2Size
	}
	if err := r.need(attrLen, "interface attributes"); err != nil {
		return t, false, err
	}
	t.attr = b[r.off : r.off+attrLen]
	r.off += attrLen
	if err := r.need(1, "interface address length"); err != nil {
		return t, false, err
	}
	lb := b[r.off]
	lastTL = lb&ucpAddrFlagLast != 0
	if lb&ucpAddrFlagHasEP != 0 {
		return t, false, fmt.Errorf("endpoint addresses in a worker address (transport %s)", tlName(t.csum))
	}
	n, err := r.extended(ucpIfaceLenMask, "interface address length")
	if err != nil {
		return t, false, err
	}
	if err := r.need(n, "interface address"); err != nil {
		return t, false, err
	}
	t.addr = b[r.off : r.off+n]
	r.off += n
	if err := checkIfaceAttr(t, r.version); err != nil {
		return t, false, fmt.Errorf("transport %s: %v", tlName(t.csum), err)
	}
	return t, lastTL, nil
}

// unpackReleaseVersion is ucp_address_unpack_release_version: the peer's
// minor release from its 4 packed bits, nearest to this release's.
func unpackReleaseVersion(v UCXVersion, packed int) int {
	if packed == 0 {
		return 0 // not packed: a release before 1.19
	}
	r := 1 << ucpRelVerBits
	delta := int(v.Minor)%r - packed
	base := int(v.Minor) / r
	if delta >= r/2 {
		base++
	}
	if delta <= -r/2 {
		base--
	}
	return packed + max(0, base)*r
}

// checkIfaceAttr checks what every transport's packed attributes must hold
// for UCX's lane selection (ucp_address_unpack_iface_attr refuses only a
// bandwidth ≤ 0, and NaN passes that).
func checkIfaceAttr(t ucxIface, version int) error {
	if version != ucpObjV1 {
		if binary.LittleEndian.Uint16(t.attr[4:]) == 0 {
			return fmt.Errorf("zero segment size")
		}
		return nil
	}
	f := func(i int) float64 { return float64(math.Float32frombits(binary.LittleEndian.Uint32(t.attr[4*i:]))) }
	ovh, bw, lat := f(0), f(1), f(2)
	switch {
	case math.IsNaN(ovh) || ovh < 0 || ovh >= 1:
		return fmt.Errorf("overhead %g s", ovh)
	case math.IsNaN(bw) || math.IsInf(bw, 0) || bw == 0 || math.Abs(bw) > 1e15:
		return fmt.Errorf("bandwidth %g B/s", bw)
	case math.IsNaN(lat) || math.Abs(lat) >= 1:
		return fmt.Errorf("latency overhead %g s", lat)
	}
	return nil
}

// ifaceCaps is the part of packed interface attributes that a transport's
// release and settings fix: priority and capability flags (v1:
// prio_cap_flags; v2: prio, seg_size, flags).
func ifaceCaps(t ucxIface, version int) []byte {
	if version == ucpObjV1 {
		return t.attr[12:16]
	}
	return t.attr[3:8]
}

// entryCaps are the priority and capability bytes a peer of this
// worker's UCX release and settings may pack for the transport of t, one
// of this worker's own entries: t's own, and for tcp t's with either
// priority, since UCX's tcp gives the host's default interface priority 0
// and every other 1 (uct_tcp_iface_query), and which interface is the
// default is the peer host's own fact. The priority is the first byte in
// both formats (v1: the low byte of prio_cap_flags; v2: prio).
func entryCaps(t ucxIface, version int) [][]byte {
	c := ifaceCaps(t, version)
	if tlName(t.csum) != "tcp" {
		return [][]byte{c}
	}
	out := [][]byte{}
	for _, prio := range []byte{0, 1} {
		p := bytes.Clone(c)
		p[0] = prio
		out = append(out, p)
	}
	return out
}

func tlName(csum uint16) string {
	if n, ok := ucxChecked[csum]; ok {
		return n
	}
	return fmt.Sprintf("with name checksum %#04x", csum)
}

// UCXLocal is what a ucx agent knows of its own UCX, from its own worker
// address: the release, the header it writes, its transports and their
// entries, and the sizes of its shared-memory FIFO segments.
type UCXLocal struct {
	ver    UCXVersion
	header []byte
	uuid   uint64
	own    map[uint16]ucxIface // by transport checksum: this worker's entry
	ownDev map[uint16][]byte   // and its device address
	// caps are the priority and capability bytes of every entry of each
	// transport this worker has: a transport on several devices (tcp)
	// packs a priority per device.
	caps map[uint16]map[string]bool
	fifo map[string]int64 // posix, sysv: this worker's FIFO segment size
	// entries are all this worker's (transport, device, interface)
	// addresses: a peer's that equals one is this worker. shapes are their
	// (transport, device address length, interface address length).
	entries map[string]bool
	shapes  map[string]bool
}

func shapeKey(csum uint16, dev, iface int) string { return fmt.Sprintf("%04x/%d/%d", csum, dev, iface) }

func entryKey(csum uint16, dev, iface []byte) string {
	return fmt.Sprintf("%04x/%x/%x", csum, dev, iface)
}

// hasEntry says whether this worker wrote the entry.
func (l *UCXLocal) hasEntry(csum uint16, dev, iface []byte) bool {
	return l.entries[entryKey(csum, dev, iface)]
}

// NewUCXLocal describes this process's UCX of release v from a worker's
// own packed address (self), for the checks of peers' addresses and keys.
func NewUCXLocal(self []byte, v UCXVersion) (*UCXLocal, error) {
	a, err := parseUCXAddress(self, v)
	if err != nil {
		return nil, fmt.Errorf("this process's own UCX worker address does not parse (UCX %v): %v", v, err)
	}
	l := &UCXLocal{ver: v, header: append([]byte(nil), a.header...), uuid: a.uuid, own: map[uint16]ucxIface{},
		ownDev: map[uint16][]byte{}, fifo: map[string]int64{}, entries: map[string]bool{},
		shapes: map[string]bool{}, caps: map[uint16]map[string]bool{}}
	for _, d := range a.devices {
		for _, t := range d.ifaces {
			l.entries[entryKey(t.csum, d.addr, t.addr)] = true
			l.shapes[shapeKey(t.csum, len(d.addr), len(t.addr))] = true
			if l.caps[t.csum] == nil {
				l.caps[t.csum] = map[string]bool{}
			}
			for _, c := range entryCaps(t, a.version) {
				l.caps[t.csum][string(c)] = true
			}
			if _, dup := l.own[t.csum]; dup {
				continue // a transport on several devices (tcp): the first
			}
			l.own[t.csum], l.ownDev[t.csum] = t, d.addr
			switch tlName(t.csum) {
			case "posix", "sysv":
				n, owner, err := mmFIFO(tlName(t.csum), t.addr)
				if err != nil {
					return nil, fmt.Errorf("this process's own %s FIFO: %v", tlName(t.csum), err)
				}
				if owner != os.Getpid() {
					return nil, fmt.Errorf("this process's own %s FIFO names process %d at byte %d, not this one (%d): "+
						"a FIFO layout kvbridge does not know", tlName(t.csum), owner, mmFIFOPIDOffset, os.Getpid())
				}
				l.fifo[tlName(t.csum)] = n
			}
		}
	}
	return l, nil
}

// CheckAddress validates a peer's worker address for this process's UCX;
// the parsed address comes back for the keys' checks.
func (l *UCXLocal) CheckAddress(b []byte) (*UCXAddress, error) {
	if len(b) < len(l.header) || string(b[:len(l.header)]) != string(l.header) {
		h := b
		if len(h) > len(l.header) {
			h = h[:len(l.header)]
		}
		return nil, fmt.Errorf("UCX worker address header %x, this process writes %x: "+
			"not an address of this UCX build and configuration", h, l.header)
	}
	a, err := parseUCXAddress(b, l.ver)
	if err != nil {
		return nil, err
	}
	if a.hasUUID && a.uuid == l.uuid {
		return nil, fmt.Errorf("the address names this worker itself (uuid %#x)", a.uuid)
	}
	mdComponent := map[int]string{}
	for i, d := range a.devices {
		for j, t := range d.ifaces {
			own, local := l.own[t.csum]
			if !local {
				continue // UCX never hands it to a transport
			}
			name, checked := ucxChecked[t.csum]
			if !checked {
				name = tlName(t.csum)
			}
			where := fmt.Sprintf("device %d, transport %s", i, name)
			if prev, ok := mdComponent[d.md]; ok && prev != name {
				return nil, fmt.Errorf("%s: md %d also serves %s", where, d.md, prev)
			}
			mdComponent[d.md] = name
			if c := ifaceCaps(t, a.version); !l.caps[t.csum][string(c)] {
				return nil, fmt.Errorf("%s (entry %d): priority and capabilities %x, this process's %s has %x: "+
					"not the same UCX release and transport settings", where, j, c, name, ifaceCaps(own, a.version))
			}
			if !checked {
				// A transport this process runs whose address fields this
				// file does not model (InfiniBand, CUDA IPC, ...): UCX hands
				// the entry to it, which reads the fixed-size addresses it
				// writes itself. Their sizes must be those this process's
				// own entries of the transport have; their contents are the
				// transport's to read.
				if !l.shapes[shapeKey(t.csum, len(d.addr), len(t.addr))] {
					return nil, fmt.Errorf("%s: device address of %d bytes and interface address of %d, "+
						"not a size this process's own %s entries have", where, len(d.addr), len(t.addr), name)
				}
				continue
			}
			if d.paths != 1 {
				return nil, fmt.Errorf("%s: %d paths on a %s device", where, d.paths, name)
			}
			pid, err := l.checkTransport(name, d.addr, t.addr)
			if err != nil {
				return nil, fmt.Errorf("%s: %v", where, err)
			}
			if pid != 0 {
				if a.peerPID != 0 && pid != a.peerPID {
					return nil, fmt.Errorf("%s names process %d, an earlier entry process %d", where, pid, a.peerPID)
				}
				a.peerPID = pid
			}
		}
	}
	return a, nil
}

// checkSMDevice checks a shared-memory device address (uct_sm: the system
// id, and the IPC namespace when the id's flag says so).
func checkSMDevice(dev []byte, v UCXVersion) error {
	if len(dev) != 8 && len(dev) != 8+v.nsLen() {
		return fmt.Errorf("shared-memory device address of %d bytes", len(dev))
	}
	ns := binary.LittleEndian.Uint64(dev)&uctLocalAddrFlagNS != 0
	if ns != (len(dev) == 8+v.nsLen()) {
		return fmt.Errorf("shared-memory device address of %d bytes with namespace flag %v", len(dev), ns)
	}
	return nil
}

// checkTransport checks one entry of a transport this process runs; it
// returns the process the entry names (cma, posix procfs), or 0.
func (l *UCXLocal) checkTransport(name string, dev, iface []byte) (int, error) {
	own := l.own[ucsCRC16(name)]
	switch name {
	case "self":
		if len(dev) != 0 || len(iface) != 8 {
			return 0, fmt.Errorf("device address of %d bytes, interface address of %d (want 0 and 8)", len(dev), len(iface))
		}
		return 0, nil
	case "tcp":
		if len(dev) < 2 {
			return 0, fmt.Errorf("device address of %d bytes", len(dev))
		}
		flags, family := dev[0], dev[1]
		want := 0
		switch {
		case flags&^1 != 0:
			return 0, fmt.Errorf("device address flags %#x", flags)
		case family != afINET && family != afINET6:
			return 0, fmt.Errorf("address family %d", family)
		case flags == 1:
			want = 2 + 8 + l.ver.nsLen() // the local system id and network namespace
		case family == afINET:
			want = 2 + 4
		default:
			want = 2 + 16
		}
		if len(dev) != want {
			return 0, fmt.Errorf("device address of %d bytes, want %d", len(dev), want)
		}
		if len(iface) != 2 || binary.BigEndian.Uint16(iface) == 0 {
			return 0, fmt.Errorf("interface address %x (want a port)", iface)
		}
		return 0, nil
	case "posix", "sysv", "cma":
		if err := checkSMDevice(dev, l.ver); err != nil {
			return 0, err
		}
	}
	if len(iface) != len(own.addr) {
		return 0, fmt.Errorf("interface address of %d bytes, this process's is %d", len(iface), len(own.addr))
	}
	switch name {
	case "cma":
		id := binary.LittleEndian.Uint32(iface)
		if (id&uctCMAAddrFlagPIDNS != 0) != (len(iface) == 4+l.ver.nsLen()) {
			return 0, fmt.Errorf("PID-namespace flag does not match an address of %d bytes", len(iface))
		}
		pid := int(id &^ uctCMAAddrFlagPIDNS)
		if pid <= 0 || pid > linuxPIDMaxLimit {
			return 0, fmt.Errorf("pid %d", pid)
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
			return 0, fmt.Errorf("process %d: %v", pid, err)
		}
		return pid, nil
	case "posix":
		seg := binary.LittleEndian.Uint64(iface)
		if (seg&posixSegPIDNS != 0) != (len(iface) == 8+l.ver.nsLen()) {
			return 0, fmt.Errorf("PID-namespace flag does not match an address of %d bytes", len(iface))
		}
		size, pid, owner, err := posixSegmentPeek(seg, true)
		if err != nil {
			return 0, err
		}
		if size != l.fifo["posix"] {
			return 0, fmt.Errorf("FIFO segment of %d bytes, this process's is %d", size, l.fifo["posix"])
		}
		if pid != 0 && owner != pid {
			return 0, fmt.Errorf("the FIFO segment of process %d says it is process %d's", pid, owner)
		}
		return owner, nil
	case "sysv":
		seg := binary.LittleEndian.Uint64(iface)
		if len(iface) != 8 || seg > math.MaxInt32 {
			return 0, fmt.Errorf("shmid %#x", seg)
		}
		size, pid, err := sysvSegment(int(seg))
		if err != nil {
			return 0, err
		}
		if size != l.fifo["sysv"] {
			return 0, fmt.Errorf("FIFO segment of %d bytes, this process's is %d", size, l.fifo["sysv"])
		}
		owner, err := sysvFIFOOwner(int(seg))
		if err != nil {
			return 0, err
		}
		if owner != pid {
			return 0, fmt.Errorf("the FIFO segment process %d created says it is process %d's", pid, owner)
		}
		return owner, nil
	}
	return 0, fmt.Errorf("no check for transport %s", name)
}

// mmFIFO is the size of one of this process's own mm FIFO segments and the
// pid its control block names.
func mmFIFO(name string, iface []byte) (int64, int, error) {
	if len(iface) < 8 {
		return 0, 0, fmt.Errorf("interface address of %d bytes", len(iface))
	}
	seg := binary.LittleEndian.Uint64(iface)
	if name == "sysv" {
		n, _, err := sysvSegment(int(seg))
		if err != nil {
			return 0, 0, err
		}
		owner, err := sysvFIFOOwner(int(seg))
		return n, owner, err
	}
	n, _, owner, err := posixSegmentPeek(seg, true)
	return n, owner, err
}

var posixSegName = regexp.MustCompile(`^/dev/shm/ucx_shm_posix_[0-9a-f]+( \(deleted\))?$`)

// posixSegment finds the file a posix segment id names, as
// uct_posix_mem_attach_common would open it, and opens it as UCX would
// (without mapping it): it must be a UCX posix segment. It returns its size
// and, for a procfs link, the process holding it.
func posixSegment(seg uint64) (size int64, pid int, err error) {
	size, pid, _, err = posixSegmentPeek(seg, false)
	return size, pid, err
}

// posixSegmentPeek is posixSegment, and with fifo the pid a FIFO segment's
// control block names.
func posixSegmentPeek(seg uint64, fifo bool) (size int64, pid, owner int, err error) {
	mmid := seg &^ posixSegFlags
	var path string
	if seg&posixSegHugeTLB != 0 {
		// MAP_HUGETLB does not map a /dev/shm file: UCX's attach fails, and
		// UCX 1.13 crashes when an rkey's attach fails (ucp_rkey_destroy
		// releases the key it could not unpack).
		return 0, 0, 0, fmt.Errorf("segment id %#x: a huge-page segment", seg)
	}
	switch {
	case seg&posixSegProcfs != 0:
		fd := int(mmid >> posixProcfsBits)
		pid = int(mmid & (1<<posixProcfsBits - 1))
		if pid == 0 {
			return 0, 0, 0, fmt.Errorf("segment id %#x names pid 0", seg)
		}
		path = fmt.Sprintf("/proc/%d/fd/%d", pid, fd)
		target, err := os.Readlink(path)
		if err != nil {
			return 0, 0, 0, fmt.Errorf("segment %#x: %v", seg, err)
		}
		if !posixSegName.MatchString(target) {
			return 0, 0, 0, fmt.Errorf("segment %#x: %s is %s, not a UCX posix segment", seg, path, target)
		}
	case seg&posixSegShmOpen != 0:
		if mmid > math.MaxUint32 {
			return 0, 0, 0, fmt.Errorf("segment id %#x: shm_open id beyond 32 bits", seg)
		}
		path = fmt.Sprintf("/dev/shm/ucx_shm_posix_%x", mmid)
	default:
		// A backing file in a directory the peer names: UCX reads the path
		// as a string from the address (and asserts when there is none).
		return 0, 0, 0, fmt.Errorf("segment id %#x: a file-backed segment (UCX_POSIX_DIR) is not accepted", seg)
	}
	// Opened as UCX opens it (read-write), so UCX's open cannot fail where
	// this one succeeded; it is closed without being mapped.
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("segment %#x: %v", seg, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, 0, 0, fmt.Errorf("segment %#x: %v", seg, err)
	}
	if !st.Mode().IsRegular() {
		return 0, 0, 0, fmt.Errorf("segment %#x: %s is not a regular file", seg, path)
	}
	if fifo {
		var b [4]byte
		if _, err := f.ReadAt(b[:], mmFIFOPIDOffset); err != nil {
			return 0, 0, 0, fmt.Errorf("segment %#x: reading its FIFO control block: %v", seg, err)
		}
		owner = int(binary.LittleEndian.Uint32(b[:]))
	}
	return st.Size(), pid, owner, nil
}

// sysvFIFOOwner is the pid a SysV FIFO segment's control block names.
func sysvFIFOOwner(shmid int) (int, error) {
	var v C.uint
	if st, err := C.kvb_shm_peek(C.int(shmid), mmFIFOPIDOffset, &v); st != 0 {
		return 0, fmt.Errorf("shmid %d: %v", shmid, err)
	}
	return int(v), nil
}

// sysvSegment is the size of SysV shared-memory segment shmid and the
// process that created it.
func sysvSegment(shmid int) (int64, int, error) {
	var cpid, rw C.int
	n, err := C.kvb_shm_size(C.int(shmid), &cpid, &rw)
	if n < 0 {
		return 0, 0, fmt.Errorf("shmid %d: %v", shmid, err)
	}
	if rw == 0 {
		return 0, 0, fmt.Errorf("shmid %d: not readable and writable by this user", shmid)
	}
	return int64(n), int(cpid), nil
}

// CheckRkey validates a packed remote key (ucp_ep_rkey_unpack's format:
// md map, memory type, one length-prefixed key per md bit) for region r of
// a peer whose address is a, and the transports' own keys for the mds of
// the checked transports. It returns a description of the first problem.
func (l *UCXLocal) CheckRkey(a *UCXAddress, key []byte, r Desc) error {
	if len(key) < 9 {
		return fmt.Errorf("remote key of %d bytes", len(key))
	}
	mdMap := binary.LittleEndian.Uint64(key)
	if mdMap == 0 {
		return fmt.Errorf("remote key for no md")
	}
	if key[8] != ucsMemTypeHost {
		return fmt.Errorf("memory type %d for DRAM (host is %d)", key[8], ucsMemTypeHost)
	}
	comp := map[int]string{}
	var mds uint64
	for _, d := range a.devices {
		if d.empty {
			continue
		}
		mds |= 1 << d.md
		for _, t := range d.ifaces {
			if _, local := l.own[t.csum]; local {
				comp[d.md] = ucxChecked[t.csum] // "" for a transport not modelled here
			}
		}
	}
	// Keys for mds the address does not have: UCX skips them, but each new
	// md map is a new rkey configuration of the worker, and those are few.
	if extra := mdMap &^ mds; extra != 0 {
		return fmt.Errorf("keys for mds %#x the worker address has no device of", extra)
	}
	off := 9
	for md := 0; md < 64; md++ {
		if mdMap&(1<<md) == 0 {
			continue
		}
		if off >= len(key) {
			return fmt.Errorf("remote key ends before md %d's key", md)
		}
		n := int(key[off])
		off++
		if len(key)-off < n {
			return fmt.Errorf("md %d's key of %d bytes, %d left", md, n, len(key)-off)
		}
		k := key[off : off+n]
		off += n
		name, ok := comp[md]
		if !ok || name == "" {
			// Not an md of a transport UCX will use here (skipped by
			// UCX), or of one whose keys are not modelled here (passed on).
			continue
		}
		if err := l.checkTLKey(a, name, k, r); err != nil {
			return fmt.Errorf("md %d (%s): %v", md, name, err)
		}
	}
	// After the keys: the memory's system device (UCX ≥ 1.19 always packs
	// one, unknown for host memory). ucp_ep_rkey_unpack reads no further.
	switch rest := key[off:]; {
	case len(rest) == 0:
	case len(rest) == 1 && rest[0] == ucsSysDevUnknown:
	default:
		return fmt.Errorf("%d unexpected bytes after the keys", len(rest))
	}
	return nil
}

func (l *UCXLocal) checkTLKey(a *UCXAddress, name string, k []byte, r Desc) error {
	switch name {
	case "self", "cma", "tcp":
		if len(k) != 0 {
			return fmt.Errorf("key of %d bytes, want none", len(k))
		}
		return nil
	case "posix":
		extra := len(l.own[ucsCRC16("posix")].addr) - 8
		if len(k) != posixRkeySize+extra {
			return fmt.Errorf("key of %d bytes, want %d", len(k), posixRkeySize+extra)
		}
		seg, addr, ln := binary.LittleEndian.Uint64(k), binary.LittleEndian.Uint64(k[8:]), binary.LittleEndian.Uint64(k[16:])
		size, pid, err := posixSegment(seg)
		if err != nil {
			return err
		}
		if pid != 0 && a.peerPID != 0 && pid != a.peerPID {
			return fmt.Errorf("segment %#x is held by process %d, the address names process %d", seg, pid, a.peerPID)
		}
		// UCX packs the page-aligned length of a segment whose file has the
		// length asked for (a mapping may end inside the file's last page,
		// never past it: SIGBUS). A key of another length names another
		// segment than the one UCX allocated for this memory.
		if pg := uint64(os.Getpagesize()); ln == 0 || ln != (uint64(size)+pg-1)/pg*pg {
			return fmt.Errorf("key maps %d bytes of a %d-byte segment", ln, size)
		}
		return within(r, addr, ln)
	case "sysv":
		if len(k) != sysvRkeySize {
			return fmt.Errorf("key of %d bytes, want %d", len(k), sysvRkeySize)
		}
		shmid, addr := binary.LittleEndian.Uint32(k), binary.LittleEndian.Uint64(k[4:])
		if shmid > math.MaxInt32 {
			return fmt.Errorf("shmid %#x", shmid)
		}
		size, pid, err := sysvSegment(int(shmid))
		if err != nil {
			return err
		}
		if a.peerPID != 0 && pid != a.peerPID {
			return fmt.Errorf("shmid %d was created by process %d, the address names process %d", shmid, pid, a.peerPID)
		}
		if err := within(r, addr, uint64(size)); err != nil {
			return err
		}
		// The segment UCX allocated for this memory: it starts at the
		// region and is no more than a huge page larger (ucs_sysv_alloc
		// rounds up to a page or a huge page).
		if uint64(r.Addr) != addr || uint64(size)-r.Len >= sysvSlack {
			return fmt.Errorf("shmid %d of %d bytes at %#x is not the segment of a %d-byte region at %#x", shmid, size, addr, r.Len, r.Addr)
		}
		return nil
	}
	return fmt.Errorf("no key check for %s", name)
}

// within checks that region r lies inside [addr, addr+n).
func within(r Desc, addr, n uint64) error {
	ra := uint64(r.Addr)
	if addr+n < addr || ra < addr || ra+r.Len > addr+n || ra+r.Len < ra {
		return fmt.Errorf("region [%#x, +%d) outside the memory its key maps, [%#x, +%d)", ra, r.Len, addr, n)
	}
	return nil
}

// describeUCXAddress is a one-line summary of an address (tests, errors).
func describeUCXAddress(a *UCXAddress) string {
	var s strings.Builder
	fmt.Fprintf(&s, "v%d flags %#x", a.version+1, a.flags)
	for i, d := range a.devices {
		fmt.Fprintf(&s, "; dev %d md %d", i, d.md)
		for _, t := range d.ifaces {
			fmt.Fprintf(&s, " %s", tlName(t.csum))
		}
	}
	return s.String()
}

// InProcess finds which agent of this process a peer's address names,
// when it names this process (locals are this process's ucx agents' own
// UCX, names their names): by its worker uuid, by a posix, sysv or cma
// entry naming this pid, or by a tcp, posix, sysv or self entry one of
// those agents wrote. Then the uuid must be that agent's and every entry
// of a transport it runs must be its own: an address of an agent here
// with another agent's (or process's) endpoint is refused. −1 when the
// address names another process.
func (a *UCXAddress) InProcess(locals []*UCXLocal, names []string) (int, error) {
	named, owner := -1, -1
	for w, l := range locals {
		if a.hasUUID && l.uuid == a.uuid {
			named = w
		}
	}
	for i, d := range a.devices {
		for _, t := range d.ifaces {
			if tlName(t.csum) == "cma" {
				continue // every agent here writes the same pid
			}
			for w, l := range locals {
				if !l.hasEntry(t.csum, d.addr, t.addr) {
					continue
				}
				if owner >= 0 && owner != w {
					return -1, fmt.Errorf("device %d: entries of agents %q and %q of this process", i, names[owner], names[w])
				}
				owner = w
			}
			if named >= 0 {
				if _, runs := locals[named].own[t.csum]; runs && !locals[named].hasEntry(t.csum, d.addr, t.addr) {
					return -1, fmt.Errorf("device %d: the worker uuid of agent %q of this process with a %s address that is not its own",
						i, names[named], tlName(t.csum))
				}
			}
		}
	}
	switch {
	case named < 0 && owner < 0 && a.peerPID != os.Getpid():
		return -1, nil
	case named < 0:
		return -1, fmt.Errorf("the address names this process but no agent of it has worker uuid %#x", a.uuid)
	case owner >= 0 && owner != named:
		return -1, fmt.Errorf("worker uuid of agent %q of this process, transport addresses of agent %q", names[named], names[owner])
	}
	return named, nil
}

// MaxWorkerAddress bounds a peer's UCX worker address (UCX's own are a
// few hundred bytes; RDMA devices add tens of bytes each).
const MaxWorkerAddress = 16 << 10
