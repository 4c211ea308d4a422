// Package snapshot is the snapshot store of SPOT-4 and PAUSE-1: memory images kept as
// fixed-size, content-addressed chunks with zero chunks skipped (WriteImage, ReadImage),
// directory images (a runtime's checkpoint: WriteDir, ReadDir) and the deletion of a
// sandbox's prefix (DeletePrefix), over any gocloud.dev/blob bucket (file://, s3://, gs://,
// azblob://). It is the only package besides the wiring that links an object-store SDK, so
// the evacuation triage (package evacuate) stays pure.
package snapshot

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"gocloud.dev/blob"
	"gocloud.dev/gcerrors"
)

// DefaultChunkSize is the chunk size of memory images: 1 MiB (SPOT-4).
const DefaultChunkSize = 1 << 20

// Manifest describes a memory image stored as fixed-size chunks (SPOT-4): Chunks[i] is the
// content hash of chunk i, or "" for a chunk of zeros, which is neither stored nor fetched.
type Manifest struct {
	Size      int64    `json:"size"`
	ChunkSize int      `json:"chunk_size"`
	Chunks    []string `json:"chunks"`
}

// ChunkStats counts what a write or read moved: bytes and chunks stored (or fetched), and
// zero chunks skipped.
type ChunkStats struct {
	BytesMoved  int64
	ChunksMoved int
	ZeroChunks  int
}

// WriteImage stores size bytes from r under name in bucket as chunks plus a manifest
// (<name>/manifest.json, chunks content-addressed under <domain>chunks/<sha256>, so equal
// chunks are stored once per domain). The domain is the first element of name when name has
// one ("sb-1/p2/checkpoint.img" → "sb-1/chunks/…"), so everything of one sandbox lives under
// its own prefix and DeletePrefix can remove it without touching another's chunks; a name
// without "/" shares the bucket-wide "chunks/". Zero chunks are not stored. The bucket is any gocloud.dev/blob bucket:
// file:// by default, s3://, gs:// or azblob:// by URL. Errors: a short read or the store's.
func WriteImage(ctx context.Context, bucket *blob.Bucket, name string, r io.Reader, size int64, chunkSize int) (Manifest, ChunkStats, error) {
	if chunkSize <= 0 {
		chunkSize = DefaultChunkSize
	}
	m := Manifest{Size: size, ChunkSize: chunkSize}
	var st ChunkStats
	buf := make([]byte, chunkSize)
	for off := int64(0); off < size; off += int64(chunkSize) {
		n := int(min(int64(chunkSize), size-off))
		if _, err := io.ReadFull(r, buf[:n]); err != nil {
			return m, st, fmt.Errorf("snapshot: read image %s at %d: %w", name, off, err)
		}
		if isZero(buf[:n]) {
			m.Chunks = append(m.Chunks, "")
			st.ZeroChunks++
			continue
		}
		sum := sha256.Sum256(buf[:n])
		key := chunkDomain(name) + "chunks/" + hex.EncodeToString(sum[:])
		m.Chunks = append(m.Chunks, key)
		if ok, err := bucket.Exists(ctx, key); err != nil {
			return m, st, fmt.Errorf("snapshot: chunk %s: %w", key, err)
		} else if ok {
			continue
		}
		if err := bucket.WriteAll(ctx, key, buf[:n], nil); err != nil {
			return m, st, fmt.Errorf("snapshot: write chunk %s: %w", key, err)
		}
		st.BytesMoved += int64(n)
		st.ChunksMoved++
	}
	b, err := json.Marshal(m)
	if err != nil {
		return m, st, err
	}
	if err := bucket.WriteAll(ctx, name+"/manifest.json", b, nil); err != nil {
		return m, st, fmt.Errorf("snapshot: write manifest of %s: %w", name, err)
	}
	return m, st, nil
}

// ReadImage restores the image stored under name into w, fetching only non-zero chunks and
// writing zeros for the rest. Errors: no such image (wraps ErrNoImage), a damaged manifest or
// chunk, or the writer's.
func ReadImage(ctx context.Context, bucket *blob.Bucket, name string, w io.Writer) (Manifest, ChunkStats, error) {
	var m Manifest
	var st ChunkStats
	b, err := bucket.ReadAll(ctx, name+"/manifest.json")
	if gcerrors.Code(err) == gcerrors.NotFound {
		return m, st, fmt.Errorf("snapshot: image %s: %w", name, ErrNoImage)
	}
	if err != nil {
		return m, st, fmt.Errorf("snapshot: manifest of %s: %w", name, err)
	}
	if err := json.Unmarshal(b, &m); err != nil || m.ChunkSize <= 0 || m.Size < 0 ||
		int64(len(m.Chunks)) != (m.Size+int64(m.ChunkSize)-1)/int64(m.ChunkSize) {
		return m, st, fmt.Errorf("snapshot: manifest of %s is damaged", name)
	}
	zeros := make([]byte, m.ChunkSize)
	for i, key := range m.Chunks {
		n := int(min(int64(m.ChunkSize), m.Size-int64(i)*int64(m.ChunkSize)))
		chunk := zeros[:n]
		if key == "" {
			st.ZeroChunks++
		} else {
			if chunk, err = bucket.ReadAll(ctx, key); err != nil {
				return m, st, fmt.Errorf("snapshot: chunk %d of %s: %w", i, name, err)
			}
			if len(chunk) != n {
				return m, st, fmt.Errorf("snapshot: chunk %d of %s has %d bytes, want %d", i, name, len(chunk), n)
			}
			st.BytesMoved += int64(n)
			st.ChunksMoved++
		}
		if _, err := w.Write(chunk); err != nil {
			return m, st, fmt.Errorf("snapshot: restore %s: %w", name, err)
		}
	}
	return m, st, nil
}

// chunkDomain returns the prefix under which name's chunks live: "<first element>/" or "".
func chunkDomain(name string) string {
	if first, _, ok := strings.Cut(name, "/"); ok && first != "" {
		return first + "/"
	}
	return ""
}

// ErrNoImage is returned (wrapped) by ReadImage for an image that was never written.
var ErrNoImage = errors.New("no such image")

func isZero(b []byte) bool {
	// bytes.Count of a zero byte is vectorised; equal length means all zero.
	return bytes.Count(b, []byte{0}) == len(b)
}
