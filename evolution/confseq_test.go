package evolution

import (
	"math"
	"testing"
)

// The reference values are confseq's own unit tests
// (github.com/gostevehoward/confseq, test/uniform_boundaries_unittest.cpp,
// "all target values are from a reference implementation in R"):
//
//	TwoSidedNormalMixture::best_rho(100, 0.05)              = 12.60056
//	TwoSidedNormalMixture(100, 0.05).log_superMG(10, 100)   = -0.6510052
//	TwoSidedNormalMixture(100, 0.05).bound(100, log(1/.05)) = 30.35209
//	OneSidedNormalMixture(100, 0.05).log_superMG(10, 100)   = -0.06502391
//	OneSidedNormalMixture(100, 0.05).bound(100, log(1/.05)) = 27.66071
//
// where OneSidedNormalMixture(v_opt, α) takes ρ = best_rho(v_opt, 2α).
func TestNormalMixtureMatchesConfseq(t *testing.T) {
	const tol = 1e-5
	two := mixtureRho(100, 0.05)
	one := mixtureRho(100, 2*0.05)
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"best_rho(100, 0.05)", two, 12.60056},
		{"two-sided log_superMG(10, 100)", twoSidedLogMixture(10, 100, two), -0.6510052},
		{"two-sided bound(100, log 20)", twoSidedBound(100, math.Log(20), two), 30.35209},
		{"one-sided log_superMG(10, 100)", oneSidedLogMixture(10, 100, one), -0.06502391},
		{"one-sided bound(100, log 20)", oneSidedBound(100, math.Log(20), one), 27.66071},
	} {
		if math.Abs(c.got-c.want) > tol {
			t.Errorf("%s = %.7g, confseq gives %.7g", c.name, c.got, c.want)
		}
	}
}
