package evolution

import "math"

// The uniform boundaries behind the judge, after Howard, Ramdas, McAuliffe and
// Sekhon, "Time-uniform, nonparametric, nonasymptotic confidence sequences",
// Annals of Statistics 49(2), 2021 (§3.2 and Proposition 5, the normal
// mixture), and the reference implementation of the same authors' confseq
// package (github.com/gostevehoward/confseq, uniform_boundaries.h), whose
// published test values evolution's tests check these functions against.
//
// A boundary u(v) bounds a martingale S_t with variance process V_t: with
// probability at least 1 − α, S_t < u(V_t) at every t at once. Here S_t is a
// sum of standardised differences and V_t is the number of pairs, so u/t is
// the half-width of a confidence sequence for the mean, in units of the
// standard deviation.

// mixtureRho returns the two-sided normal mixture's ρ that makes its boundary
// tightest at intrinsic time v for crossing probability alpha (confseq's
// TwoSidedNormalMixture::best_rho). The one-sided mixture uses
// mixtureRho(v, 2α) (OneSidedNormalMixture::best_rho).
func mixtureRho(v, alpha float64) float64 {
	l := 2 * math.Log(1/alpha)
	return v / (l + math.Log(1+l))
}

// twoSidedLogMixture is the logarithm of the two-sided normal mixture
// martingale, the likelihood ratio mixed over λ ~ N(0, 1/ρ):
//
//	½ ln(ρ/(v+ρ)) + s²/(2(v+ρ))
func twoSidedLogMixture(s, v, rho float64) float64 {
	return 0.5*math.Log(rho/(v+rho)) + s*s/(2*(v+rho))
}

// twoSidedBound is the closed-form boundary of the two-sided normal mixture
// at log-threshold ln(1/α): |S_t| < sqrt((v+ρ)(ln(1+v/ρ) + 2 ln(1/α))).
func twoSidedBound(v, logThreshold, rho float64) float64 {
	return math.Sqrt((v + rho) * (math.Log1p(v/rho) + 2*logThreshold))
}

// oneSidedLogMixture is the logarithm of the one-sided normal mixture
// martingale, mixed over λ ≥ 0 with the half-normal density of N(0, 1/ρ):
//
//	½ ln(4ρ/(v+ρ)) + s²/(2(v+ρ)) + ln Φ(s/√(v+ρ))
//
// It crosses ln(1/α) with probability at most α under a mean of zero (and
// under any negative mean: every λ ≥ 0 makes a supermartingale there).
func oneSidedLogMixture(s, v, rho float64) float64 {
	return 0.5*math.Log(4*rho/(v+rho)) + s*s/(2*(v+rho)) + logPhi(s/math.Sqrt(v+rho))
}

// oneSidedBound is the smallest s at which oneSidedLogMixture reaches
// logThreshold, by bisection (it is increasing in s). It lies between 0 and
// the two-sided bound, since the one-sided mixture is the two-sided one
// times 2Φ(·) ≥ 1 for s ≥ 0.
func oneSidedBound(v, logThreshold, rho float64) float64 {
	lo, hi := 0.0, twoSidedBound(v, logThreshold, rho)
	for range 60 {
		mid := (lo + hi) / 2
		if oneSidedLogMixture(mid, v, rho) < logThreshold {
			lo = mid
		} else {
			hi = mid
		}
		if hi-lo <= 1e-12*hi {
			break
		}
	}
	return (lo + hi) / 2
}

// logPhi is ln Φ(x), Φ the standard normal distribution function; -Inf far
// in the left tail.
func logPhi(x float64) float64 {
	return math.Log(0.5 * math.Erfc(-x/math.Sqrt2))
}

// pairedSign is the state of a sequential test on a paired ±1 difference:
// for each pair X = +1 when only the candidate showed the event (failed, or
// disagreed with the primary), −1 when only the control did, 0 otherwise.
// E[X] is then the difference of the two sides' rates, whatever the
// correlation between the sides.
//
// The test is a betting (capital-process) e-value, Waudby-Smith and Ramdas,
// "Estimating means of bounded random variables by betting", JRSS B 86(1),
// 2024: for a hypothesised mean m, each fixed bet λ ∈ [0, 1/(1+m)) gives the
// nonnegative martingale Π(1 + λ(X_i − m)) when E[X] = m (a supermartingale
// when E[X] ≤ m); an average of them over a fixed grid of λ is one too, so
// by Ville's inequality it exceeds 1/α with probability at most α, at any
// look. Because X takes only three values, the product depends only on the
// counts, so an update is three integer increments and the e-value at any m
// is a sum over the grid. With m = 0 it is a mixture sequential probability
// ratio test on the discordant pairs alone (a concordant pair multiplies by
// 1): P(candidate only | discordant) = (1+λ)/2 against ½, the beta-binomial
// mixture of Howard et al. with a uniform prior on [½, 1].
type pairedSign struct {
	n, plus, minus int
}

// betGrid is the fixed grid of bets, as fractions of the largest bet
// 1/(1+m): the midpoints of 24 equal cells of (0, 1), i.e. a discretised
// uniform prior.
var betGrid = func() (g [24]float64) {
	for i := range g {
		g[i] = (float64(i) + 0.5) / float64(len(g))
	}
	return g
}()

// logE returns the logarithm of the e-value against E[X] ≤ m.
func (p pairedSign) logE(m float64) float64 {
	if m >= 1 {
		return math.Inf(-1) // E[X] ≤ 1 always
	}
	if m < -1+1e-9 {
		m = -1 + 1e-9 // keeps the largest bet finite
	}
	zeros := float64(p.n - p.plus - p.minus)
	lmax := 1 / (1 + m)
	// log-sum-exp over the grid
	var logs [len(betGrid)]float64
	top := math.Inf(-1)
	for i, u := range betGrid {
		l := u * lmax
		x := float64(p.plus)*math.Log1p(l*(1-m)) + float64(p.minus)*math.Log1p(-l*(1+m))
		if zeros > 0 && m != 0 {
			x += zeros * math.Log1p(-l*m)
		}
		logs[i] = x
		top = math.Max(top, x)
	}
	if math.IsInf(top, -1) {
		return top
	}
	var sum float64
	for _, x := range logs {
		sum += math.Exp(x - top)
	}
	return top + math.Log(sum/float64(len(betGrid)))
}

// mean is the estimate of E[X]; 0 before any pair.
func (p pairedSign) mean() float64 {
	if p.n == 0 {
		return 0
	}
	return float64(p.plus-p.minus) / float64(p.n)
}

// lower is the lower end of the confidence sequence for E[X] at
// log-threshold ln(1/α): the smallest m that the test does not reject.
// -1 before any evidence.
func (p pairedSign) lower(logThreshold float64) float64 {
	lo, hi := -1.0, p.mean()
	if p.logE(lo) < logThreshold {
		return -1
	}
	for range 50 {
		mid := (lo + hi) / 2
		if p.logE(mid) >= logThreshold {
			lo = mid
		} else {
			hi = mid
		}
		if hi-lo < 1e-7 {
			break
		}
	}
	return lo
}

// upper is the upper end: the lower end of the mirrored test.
func (p pairedSign) upper(logThreshold float64) float64 {
	return -pairedSign{n: p.n, plus: p.minus, minus: p.plus}.lower(logThreshold)
}
