package sim

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"embed"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// The Alibaba workload built into the binary, so that `berth sim --workload alibaba` runs from
// any directory (issue 13): a compact copy, derived from the Alibaba Cluster Trace Program, of
// exactly what the simulator reads from the original CSVs. sim/traces/README.md says where it
// comes from and how sim/traces/derive.go makes it.
//
//go:embed traces/alibaba-pods.csv.gz traces/alibaba-util.txt.gz
var alibabaFS embed.FS

// Names of the built-in trace files inside alibabaFS.
const (
	alibabaPodsFile = "traces/alibaba-pods.csv.gz"
	alibabaUtilFile = "traces/alibaba-util.txt.gz"
)

// SeriesScale is the unit of the compact utilisation series: a value n stands for a
// resident ÷ configured of n / SeriesScale (so 4 decimal places are kept).
const SeriesScale = 10000

// Alibaba returns the built-in Alibaba workload: the openb pod list (8,151 pods: arrival and
// departure in seconds, configured memory in MiB) and the 208 measured memory-utilisation
// series of the GenAI trace, in the order LoadPods and LoadUtil give for the original CSVs
// (SIM-1 workload b). Utilisation values are rounded to 1/SeriesScale.
func Alibaba() (pods []Pod, util [][]float64, err error) {
	open := func(name string) (io.Reader, error) {
		b, err := alibabaFS.ReadFile(name)
		if err != nil {
			return nil, err
		}
		return gzip.NewReader(bytes.NewReader(b))
	}
	r, err := open(alibabaPodsFile)
	if err != nil {
		return nil, nil, fmt.Errorf("sim: built-in %s: %w", alibabaPodsFile, err)
	}
	if pods, _, err = ReadPods(r, "built-in "+alibabaPodsFile); err != nil {
		return nil, nil, err
	}
	if r, err = open(alibabaUtilFile); err != nil {
		return nil, nil, fmt.Errorf("sim: built-in %s: %w", alibabaUtilFile, err)
	}
	if util, err = ReadSeries(r); err != nil {
		return nil, nil, fmt.Errorf("sim: built-in %s: %w", alibabaUtilFile, err)
	}
	return pods, util, nil
}

// ReadSeries reads utilisation series in the compact form WriteSeries writes: one series per
// line, its samples in time order as comma-separated integers in units of 1/SeriesScale;
// lines starting with '#' are comments. A value that is not an integer is an error.
func ReadSeries(r io.Reader) ([][]float64, error) {
	var out [][]float64
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Split(line, ",")
		s := make([]float64, len(fields))
		for i, f := range fields {
			v, err := strconv.ParseInt(f, 10, 32)
			if err != nil {
				return nil, fmt.Errorf("line %d, sample %d: %w", n, i+1, err)
			}
			s[i] = float64(v) / SeriesScale
		}
		out = append(out, s)
	}
	return out, sc.Err()
}

// WriteSeries writes util in ReadSeries' form under a one-line comment, each value rounded
// to the nearest 1/SeriesScale.
func WriteSeries(w io.Writer, comment string, util [][]float64) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "# %s\n", strings.ReplaceAll(comment, "\n", " "))
	for _, s := range util {
		for i, v := range s {
			if i > 0 {
				bw.WriteByte(',')
			}
			bw.WriteString(strconv.FormatInt(int64(math.Round(v*SeriesScale)), 10))
		}
		bw.WriteByte('\n')
	}
	return bw.Flush()
}
