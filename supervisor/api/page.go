package api

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/json"
	"fmt"
	"html/template"
	"maps"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/agent-sidecar/supervisor/internal/clip"
)

// The status page: GET / renders the same data as GET /v1/status into HTML
// on the server (readable with JavaScript off); static/status.js then
// refreshes it from /v1/status every 2 s. No external assets, no inline
// script or style: the Content-Security-Policy is default-src 'self'.

//go:embed static/index.html static/status.css static/status.js
var staticFS embed.FS

var pageTmpl = template.Must(template.New("index.html").Funcs(template.FuncMap{"stamp": stamp, "dash": dash}).
	ParseFS(staticFS, "static/index.html"))

// tokenCookie carries the --http-token-file token for a browser that
// opened the page once with ?token=.
const tokenCookie = "supervisor_token"

// pageHeaders are on every response of the page's paths.
func pageHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", "default-src 'self'")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("Referrer-Policy", "no-referrer")
		h.ServeHTTP(w, r)
	})
}

// pageRoutes are the status page's paths.
func (s *Server) pageRoutes(mux *http.ServeMux) {
	mux.Handle("GET /{$}", pageHeaders(s.requirePageToken(http.HandlerFunc(s.handlePage))))
	mux.Handle("GET /v1/status", pageHeaders(s.requirePageToken(http.HandlerFunc(s.handleStatus))))
	// The stylesheet and the script hold no data: open like the probes.
	// Browsers ask for one: no icon, and no 404 in the console.
	mux.Handle("GET /favicon.ico", pageHeaders(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})))
	for _, name := range []string{"status.css", "status.js"} {
		mux.Handle("GET /static/"+name, pageHeaders(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.ServeFileFS(w, r, staticFS, "static/"+name)
		})))
	}
}

// requirePageToken is requireToken for the page: the bearer header, or the
// cookie that ?token= sets once (HttpOnly, SameSite=Strict), redirecting
// to the same URL without the token.
func (s *Server) requirePageToken(h http.Handler) http.Handler {
	if s.tokenHash == nil {
		return h
	}
	bearer := s.requireToken(h)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if q.Has("token") {
			if !s.tokenOK(q.Get("token")) {
				w.Header().Set("Connection", "close")
				http.Error(w, "wrong token: open this page with ?token=TOKEN, the content of --http-token-file", http.StatusUnauthorized)
				return
			}
			http.SetCookie(w, &http.Cookie{Name: tokenCookie, Value: q.Get("token"), Path: "/", HttpOnly: true,
				SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
			q.Del("token")
			u := url.URL{Path: r.URL.Path, RawQuery: q.Encode()}
			w.Header().Set("Cache-Control", "no-store")
			http.Redirect(w, r, u.String(), http.StatusSeeOther)
			return
		}
		if c, err := r.Cookie(tokenCookie); err == nil && r.Header.Get("Authorization") == "" {
			if s.tokenOK(c.Value) {
				h.ServeHTTP(w, r)
				return
			}
		}
		bearer.ServeHTTP(w, r)
	})
}

// tokenOK compares a token with --http-token-file's in constant time.
func (s *Server) tokenOK(tok string) bool {
	sum := sha256.Sum256([]byte(tok))
	return subtle.ConstantTimeCompare(sum[:], s.tokenHash) == 1
}

// statusCacheFor is how long GET /v1/status serves the body it last
// encoded (generated_at says when that was): the page refreshes every 2 s,
// and many pollers cost one encoding a second.
const statusCacheFor = time.Second

// GET /v1/status: FullStatus as JSON (docs/operations.md lists the fields).
func (s *Server) handleStatus(w http.ResponseWriter, _ *http.Request) {
	body, err := s.statusBody(time.Now())
	if err != nil {
		http.Error(w, "encode the status: "+err.Error(), http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	_, _ = w.Write(body)
}

// statusBody returns the encoded status, at most statusCacheFor old. The
// body returned is never changed afterwards (a new one replaces it).
func (s *Server) statusBody(now time.Time) ([]byte, error) {
	c := &s.status
	c.bodyMu.Lock()
	defer c.bodyMu.Unlock()
	if c.body != nil && now.Sub(c.bodyAt) < statusCacheFor && !now.Before(c.bodyAt) {
		return c.body, nil
	}
	// Encoded whole: one write with a Content-Length, not chunks.
	var b bytes.Buffer
	if err := json.NewEncoder(&b).Encode(s.FullStatus(now)); err != nil {
		return nil, err
	}
	c.body, c.bodyAt = b.Bytes(), now
	return c.body, nil
}

// GET /: the page, rendered with the data it shows.
func (s *Server) handlePage(w http.ResponseWriter, _ *http.Request) {
	st := s.FullStatus(time.Now())
	var b bytes.Buffer
	if err := pageTmpl.Execute(&b, pageData(st)); err != nil {
		http.Error(w, "render the status page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(b.Bytes())
}

// page is what index.html renders. F holds the texts of the elements with
// a data-f attribute, computed as status.js computes them.
type page struct {
	F          map[string]string
	Late       bool // heartbeat near --heartbeat-timeout
	Restarts   []RestartRecord
	Audit      []auditRow
	Evidence   []evidenceRow
	Replica    bool
	Evolution  bool
	EntriesSVG string
	HeartSVG   string
}

type auditRow struct{ Time, Kind, Fields string }

type evidenceRow struct{ Key, Value string }

func pageData(st Status) page {
	p := page{F: fields(st), Restarts: st.RecentRestarts, Replica: st.Replica != nil, Evolution: st.Evolution != nil}
	p.Late = heartbeatLate(st)
	// Newest first, as the audit table.
	rs := make([]RestartRecord, 0, len(st.RecentRestarts))
	for i := len(st.RecentRestarts) - 1; i >= 0; i-- {
		rs = append(rs, st.RecentRestarts[i])
	}
	p.Restarts = rs
	for _, a := range st.Audit.Records {
		p.Audit = append(p.Audit, auditRow{Time: stamp(a.Time), Kind: a.Kind, Fields: fieldsText(a.Fields)})
	}
	if e := st.Evolution; e != nil && e.Last != nil {
		for _, k := range sortedKeys(e.Last.Metrics) {
			p.Evidence = append(p.Evidence, evidenceRow{Key: k, Value: num(e.Last.Metrics[k])})
		}
	}
	if h := st.History; h != nil {
		p.EntriesSVG, p.HeartSVG = sparkline(h.EntriesPerSec), sparkline(h.HeartbeatAge)
	}
	return p
}

// heartbeatLate: the heartbeat is older than three quarters of
// --heartbeat-timeout.
func heartbeatLate(st Status) bool {
	return st.HeartbeatTimeoutSeconds > 0 && st.HeartbeatAgeSeconds >= 0.75*st.HeartbeatTimeoutSeconds
}

// fields are the page's texts (status.js's fields() computes the same).
func fields(st Status) map[string]string {
	f := map[string]string{
		"state": st.State, "pid": dash(st.PID), "uptime": "—", "heartbeat": "—", "restarts": strconv.Itoa(st.Restarts),
		"last_restart": or(st.LastRestartReason), "version": or(st.Version), "generated": stamp(st.GeneratedAt),
	}
	if st.SupervisorPID != 0 {
		f["supervisor"] = "pid " + strconv.Itoa(st.SupervisorPID)
	}
	if st.PID != 0 {
		f["uptime"] = dur(st.UptimeSeconds)
	}
	if st.HeartbeatAgeSeconds > 0 || (st.PID != 0 && !st.LastHeartbeat.IsZero()) {
		f["heartbeat"] = dur(st.HeartbeatAgeSeconds) + " ago"
		if heartbeatLate(st) {
			f["heartbeat"] += " — late: the agent is restarted at " + dur(st.HeartbeatTimeoutSeconds)
		}
	}
	if w := st.WAL; w != nil {
		f["wal_last"], f["wal_durable"] = strconv.FormatUint(w.LastSequence, 10), strconv.FormatUint(w.DurableSequence, 10)
		f["wal_size"], f["wal_segments"] = bytesText(w.SizeBytes), strconv.Itoa(w.Segments)
	}
	if c := st.Checkpoints; c != nil {
		f["ckpt_newest"], f["ckpt_watermark"], f["ckpt_age"], f["ckpt_size"] = or(c.Newest), "—", "—", "—"
		if c.Newest != "" {
			f["ckpt_watermark"] = strconv.FormatUint(c.Watermark, 10)
			f["ckpt_age"] = dur(c.AgeSeconds)
			f["ckpt_size"] = bytesText(c.SizeBytes) + " (" + bytesText(c.StoredSizeBytes) + " stored)"
		}
		f["ckpt_retained"] = strconv.Itoa(c.Retained)
		if c.Bad > 0 {
			f["ckpt_retained"] += " (" + strconv.Itoa(c.Bad) + " marked bad)"
		}
	}
	if r := st.Replica; r != nil {
		f["rep_state"] = r.State + " — " + r.URL
		f["rep_lag"] = strconv.FormatUint(r.LagEntries, 10) + " entries, " + num(r.LagSeconds) + " s"
		f["rep_last"] = stamp(r.LastSuccess)
		f["rep_error"] = or(r.LastError)
	}
	if q := st.Requests; q != nil {
		f["req_window"] = dur(q.WindowSeconds)
		// dropped: answered, the result dropped to stay within the budget.
		f["req_inflight"], f["req_answered"] = strconv.Itoa(q.InFlight), strconv.Itoa(q.Answered+q.Dropped)
		f["req_failed"], f["req_expired"] = strconv.Itoa(q.Failed), strconv.Itoa(q.Expired)
	}
	f["evo_current"], f["evo_decision"], f["evo_reason"], f["evo_target"], f["evo_time"] = "none", "—", "—", "—", "—"
	if e := st.Evolution; e != nil {
		if c := e.Current; c != nil {
			f["evo_current"] = "testing " + c.Target + " (trial " + c.ID + ", since " + stamp(c.Started) + ")"
		}
		if l := e.Last; l != nil {
			f["evo_decision"], f["evo_reason"], f["evo_target"], f["evo_time"] = l.Decision, l.Reason, l.Target, stamp(l.Time)
		}
	}
	if h := st.History; h != nil && len(h.EntriesPerSec) > 0 {
		f["spark_entries"] = "now " + num(h.EntriesPerSec[len(h.EntriesPerSec)-1]) + "/s, peak " + num(maxOf(h.EntriesPerSec)) + "/s"
		f["spark_heart"] = "now " + num(h.HeartbeatAge[len(h.HeartbeatAge)-1]) + " s, peak " + num(maxOf(h.HeartbeatAge)) + " s"
	} else {
		f["spark_entries"], f["spark_heart"] = "no samples yet", "no samples yet"
	}
	return f
}

// sparkline is an SVG polyline's points for values on a 240×40 box, the
// newest at the right; status.js draws the same.
func sparkline(vs []float64) string {
	if len(vs) == 0 {
		return ""
	}
	top := max(maxOf(vs), 1e-9)
	var b bytes.Buffer
	for i, v := range vs {
		x := 240 - float64(len(vs)-1-i)*2
		y := 38 - v/top*36
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s,%s", strconv.FormatFloat(x, 'f', 1, 64), strconv.FormatFloat(y, 'f', 1, 64))
	}
	return b.String()
}

func maxOf(vs []float64) float64 {
	m := 0.0
	for _, v := range vs {
		m = max(m, v)
	}
	return m
}

// dur formats seconds as status.js's dur() does.
func dur(s float64) string {
	switch {
	case s < 60:
		return strconv.FormatFloat(s, 'f', 1, 64) + "s"
	case s < 3600:
		return fmt.Sprintf("%dm%02ds", int(s/60), int(math.Mod(s, 60)))
	case s < 86400:
		return fmt.Sprintf("%dh%02dm", int(s/3600), int(math.Mod(s, 3600)/60))
	}
	return fmt.Sprintf("%dd%02dh", int(s/86400), int(math.Mod(s, 86400)/3600))
}

// bytesText formats a size as status.js's bytes() does.
func bytesText(n int64) string {
	if n < 1024 {
		return strconv.FormatInt(n, 10) + " B"
	}
	v, u := float64(n)/1024, "KiB"
	for _, next := range []string{"MiB", "GiB", "TiB"} {
		if v < 1024 {
			break
		}
		v, u = v/1024, next
	}
	return strconv.FormatFloat(v, 'f', 1, 64) + " " + u
}

// num formats a number with at most 2 decimals, as status.js's num().
func num(v float64) string {
	return strconv.FormatFloat(math.Round(v*100)/100, 'f', -1, 64)
}

// stamp formats a time in UTC, as status.js's stamp().
func stamp(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05") + "Z"
}

func sortedKeys(m map[string]float64) []string {
	return slices.Sorted(maps.Keys(m))
}

func dash(n int) string {
	if n == 0 {
		return "—"
	}
	return strconv.Itoa(n)
}

func or(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

// fieldsText is an audit record's fields as compact JSON, clipped (the
// template escapes it).
func fieldsText(f map[string]any) string {
	if len(f) == 0 {
		return ""
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(f)
	return clip.String(string(bytes.TrimSpace(b.Bytes())), 300)
}
