package openaijs

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestRunAgainstFakeServer checks the harness itself against a hand-written
// HTTP server: a completion answer comes back parsed, a 400 in OpenAI's
// error shape comes back as the client's BadRequestError with its param,
// a 401 as AuthenticationError, and the Bearer key of the run (or the
// case's own) is what the server sees.
func TestRunAgainstFakeServer(t *testing.T) {
	r := Require(t)
	var keys []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		keys = append(keys, req.Header.Get("Authorization"))
		body, _ := io.ReadAll(req.Body)
		var in map[string]any
		_ = json.Unmarshal(body, &in)
		w.Header().Set("Content-Type", "application/json")
		switch {
		case req.Header.Get("Authorization") != "Bearer k1":
			w.WriteHeader(401)
			io.WriteString(w, `{"error":{"message":"bad key","type":"authentication_error","param":null,"code":null}}`)
		case in["n"] != nil:
			w.WriteHeader(400)
			io.WriteString(w, `{"error":{"message":"n: only 1 is supported","type":"invalid_request_error","param":"n","code":null}}`)
		default:
			io.WriteString(w, `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"hi","finish_reason":"length","logprobs":null}],"usage":{"prompt_tokens":2,"completion_tokens":1,"total_tokens":3}}`)
		}
	}))
	defer srv.Close()
	res, err := r.Run(context.Background(), srv.URL+"/v1", "k1", []Case{
		{Name: "ok", Kind: "completion", Params: map[string]any{"model": "m", "prompt": "x", "max_tokens": 1}},
		{Name: "bad", Kind: "completion", Params: map[string]any{"model": "m", "prompt": "x", "n": 2}},
		{Name: "auth", Kind: "completion", Params: map[string]any{"model": "m", "prompt": "x"}, APIKey: "wrong"},
	})
	if err != nil {
		t.Fatal(err)
	}
	var ok struct {
		Choices []struct{ Text string } `json:"choices"`
	}
	if !res[0].OK || json.Unmarshal(res[0].Response, &ok) != nil || len(ok.Choices) != 1 || ok.Choices[0].Text != "hi" {
		t.Errorf("ok case: %+v", res[0])
	}
	if e := res[1].Error; res[1].OK || e == nil || !e.BadRequest || e.Status == nil || *e.Status != 400 || e.Param == nil || *e.Param != "n" {
		t.Errorf("bad case: %+v %+v", res[1], res[1].Error)
	}
	if e := res[2].Error; res[2].OK || e == nil || !e.Authentication || e.Class != "AuthenticationError" || *e.Status != 401 {
		t.Errorf("auth case: %+v %+v", res[2], res[2].Error)
	}
	if want := []string{"Bearer k1", "Bearer k1", "Bearer wrong"}; len(keys) != 3 || keys[0] != want[0] || keys[1] != want[1] || keys[2] != want[2] {
		t.Errorf("keys seen %q, want %q", keys, want)
	}
}
