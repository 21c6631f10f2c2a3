package bench

import (
	"fmt"
	"os"
	"regexp"

	"k8s.io/apimachinery/pkg/api/resource"
)

// deployment is what the shipped dkc-server Deployment gives a replica: its memory limit, GOMEMLIMIT and
// GOGC. The benchmark runs dkc-server with the same GOMEMLIMIT and GOGC and holds the peak RSS to the
// limit, read from the manifest at run time so that the two cannot drift apart.
type deployment struct {
	limit      int64
	goMemLimit string
	goGC       string // "" when the manifest sets none (Go's default, 100)
}

var (
	memoryLimitRE = regexp.MustCompile(`limits:\s*\{\s*memory:\s*([0-9A-Za-z.]+)\s*\}`)
	goMemLimitRE  = regexp.MustCompile(`name:\s*GOMEMLIMIT\s*\n\s*value:\s*"?([0-9A-Za-z]+)"?`)
	goGCRE        = regexp.MustCompile(`name:\s*GOGC\s*\n\s*value:\s*"?([0-9A-Za-z]+)"?`)
)

// readDeployment reads the manifest at path (deploy/base/server.yaml).
func readDeployment(path string) (deployment, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return deployment{}, fmt.Errorf("read the dkc-server Deployment: %w", err)
	}
	lm := memoryLimitRE.FindSubmatch(data)
	gm := goMemLimitRE.FindSubmatch(data)
	if lm == nil || gm == nil {
		return deployment{}, fmt.Errorf("%s: no limits.memory or GOMEMLIMIT found", path)
	}
	q, err := resource.ParseQuantity(string(lm[1]))
	if err != nil {
		return deployment{}, fmt.Errorf("%s: limits.memory: %w", path, err)
	}
	d := deployment{limit: q.Value(), goMemLimit: string(gm[1])}
	if gc := goGCRE.FindSubmatch(data); gc != nil {
		d.goGC = string(gc[1])
	}
	return d, nil
}
