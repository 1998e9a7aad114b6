package serve

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/ardanlabs/jinja"
)

// chatKeys are the fields POST /v1/chat/completions accepts.
var chatKeys = append(slices.Clone(samplingKeys), "messages", "max_completion_tokens", "logprobs", "top_logprobs",
	"tools", "tool_choice", "parallel_tool_calls", "functions", "function_call", "response_format")

// chatTemplate is a model's compiled chat template and the special-token
// strings it is rendered with.
type chatTemplate struct {
	t        *jinja.Template
	bos, eos string
}

// parseChatTemplate reads chat_template from a tokenizer_config.json:
// a string, or Hugging Face's list of {"name", "template"} (the one named
// "default" is used). It returns "" when the file has none. Errors name
// the field.
func parseChatTemplate(config []byte) (string, error) {
	var cfg struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
	}
	if err := json.Unmarshal(config, &cfg); err != nil {
		return "", fmt.Errorf("tokenizer_config.json: %w", err)
	}
	if len(cfg.ChatTemplate) == 0 || isNull(cfg.ChatTemplate) {
		return "", nil
	}
	var s string
	if json.Unmarshal(cfg.ChatTemplate, &s) == nil {
		return s, nil
	}
	var list []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(cfg.ChatTemplate, &list); err != nil {
		return "", fmt.Errorf("tokenizer_config.json: chat_template: want a string or a list of {name, template}: %w", err)
	}
	for _, t := range list {
		if t.Name == "default" {
			return t.Template, nil
		}
	}
	return "", fmt.Errorf("tokenizer_config.json: chat_template: a list without a template named \"default\"")
}

// chatMessage is one message of a chat request as the template sees it.
type chatMessage struct {
	Role    string
	Content string
	Name    string
}

// parseMessages decodes messages: a non-empty list of {role, content,
// name?}; content is a string or a list of {"type": "text", "text"}
// parts (joined with "\n", as vLLM joins them). Roles: system, developer,
// user, assistant. Errors (400) name the field ("messages[2].content").
func parseMessages(f fields) ([]chatMessage, *apiError) {
	if !f.has("messages") {
		return nil, badRequest("messages", `"messages" is required`)
	}
	if e := checkUTF8("messages", f["messages"]); e != nil {
		return nil, e
	}
	var raw []fields
	if _, e := f.get("messages", &raw, "a list of message objects"); e != nil {
		return nil, e
	}
	if len(raw) == 0 {
		return nil, badRequest("messages", `"messages" must hold at least one message`)
	}
	out := make([]chatMessage, len(raw))
	for i, m := range raw {
		at := fmt.Sprintf("messages[%d]", i)
		if m == nil {
			return nil, badRequest(at, "%s must be an object", at)
		}
		for _, k := range []string{"tool_calls", "tool_call_id", "function_call"} {
			if m.has(k) {
				return nil, unsupported(at+"."+k, "tool calling is not implemented")
			}
		}
		if e := m.checkKnownIn(at, []string{"role", "content", "name", "tool_calls", "tool_call_id", "function_call"}); e != nil {
			return nil, e
		}
		if _, e := m.get("role", &out[i].Role, "a string"); e != nil || out[i].Role == "" {
			return nil, badRequest(at+".role", "%s.role must be one of system, developer, user, assistant", at)
		}
		switch out[i].Role {
		case "system", "developer", "user", "assistant":
		case "tool", "function":
			return nil, unsupported(at+".role", "tool calling is not implemented")
		default:
			return nil, badRequest(at+".role", "%s.role %q: want system, developer, user or assistant", at, out[i].Role)
		}
		if _, e := m.get("name", &out[i].Name, "a string"); e != nil {
			e.Param = at + ".name"
			return nil, e
		}
		if !m.has("content") {
			if out[i].Role == "assistant" {
				continue
			}
			return nil, badRequest(at+".content", "%s.content is required", at)
		}
		var s string
		if json.Unmarshal(m["content"], &s) == nil {
			out[i].Content = s
			continue
		}
		var parts []struct {
			Type string  `json:"type"`
			Text *string `json:"text"`
		}
		if err := json.Unmarshal(m["content"], &parts); err != nil {
			return nil, badRequest(at+".content", "%s.content must be a string or a list of text parts", at)
		}
		texts := make([]string, len(parts))
		for j, p := range parts {
			if p.Type != "text" {
				return nil, unsupported(fmt.Sprintf("%s.content[%d]", at, j), fmt.Sprintf("content part type %q; only text parts", p.Type))
			}
			if p.Text == nil {
				return nil, badRequest(fmt.Sprintf("%s.content[%d].text", at, j), "%s.content[%d].text is required in a text part (a string)", at, j)
			}
			texts[j] = *p.Text
		}
		out[i].Content = strings.Join(texts, "\n")
	}
	return out, nil
}

// render applies the chat template to msgs with add_generation_prompt
// true, bos_token and eos_token set, as transformers' apply_chat_template
// does.
func (c *chatTemplate) render(msgs []chatMessage) (string, error) {
	list := make([]any, len(msgs))
	for i, m := range msgs {
		mm := map[string]any{"role": m.Role, "content": m.Content}
		if m.Name != "" {
			mm["name"] = m.Name
		}
		list[i] = mm
	}
	return c.t.Render(map[string]any{
		"messages":              list,
		"add_generation_prompt": true,
		"bos_token":             c.bos,
		"eos_token":             c.eos,
	})
}

type chatResponse struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	Usage   *usage       `json:"usage,omitempty"`
}

type chatChoice struct {
	Index        int           `json:"index"`
	Message      *chatOut      `json:"message,omitempty"`
	Delta        *chatOut      `json:"delta,omitempty"`
	Logprobs     *chatLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
}

type chatOut struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

// chatLogprobs is the chat logprobs object: per token its text, UTF-8
// bytes and log-probability, and the top alternatives likewise.
type chatLogprobs struct {
	Content []chatTokenLogprob `json:"content"`
}

type chatTokenLogprob struct {
	Token       string            `json:"token"`
	Logprob     float32           `json:"logprob"`
	Bytes       []int             `json:"bytes"`
	TopLogprobs []chatTopLogprobs `json:"top_logprobs"`
}

type chatTopLogprobs struct {
	Token   string  `json:"token"`
	Logprob float32 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

func byteInts(s string) []int {
	b := make([]int, len(s))
	for i := range len(s) {
		b[i] = int(s[i])
	}
	return b
}

func (s *Server) handleChat(w http.ResponseWriter, r *http.Request, info *reqInfo) {
	f, e := s.readBody(w, r)
	if e != nil {
		writeError(w, e)
		return
	}
	if e := f.checkKnown(chatKeys); e != nil {
		writeError(w, e)
		return
	}
	for _, k := range []string{"tools", "functions", "function_call", "parallel_tool_calls"} {
		if f.has(k) {
			writeError(w, unsupported(k, "tool calling is not implemented"))
			return
		}
	}
	if e := f.unsupportedUnless("tool_choice", "tool calling is not implemented", `"none"`); e != nil {
		writeError(w, e)
		return
	}
	if f.has("response_format") {
		var rf struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(f["response_format"], &rf); err != nil || rf.Type != "text" {
			writeError(w, unsupported("response_format", `only {"type": "text"}; structured output is not implemented`))
			return
		}
	}
	p, e := s.parseSampling(f, "max_tokens", "max_completion_tokens")
	if e != nil {
		writeError(w, e)
		return
	}
	var wantLP bool
	if _, e := f.getBool("logprobs", &wantLP); e != nil {
		writeError(w, e)
		return
	}
	top := -1
	if wantLP {
		top = 0
	}
	var n int
	if ok, e := f.getInt("top_logprobs", &n); e != nil {
		writeError(w, e)
		return
	} else if ok {
		if !wantLP {
			writeError(w, badRequest("top_logprobs", `"top_logprobs" needs "logprobs": true`))
			return
		}
		if n < 0 || n > maxTopLogprobs {
			writeError(w, badRequest("top_logprobs", `"top_logprobs" %d: want an integer in [0, %d]`, n, maxTopLogprobs))
			return
		}
		top = n
	}
	msgs, e := parseMessages(f)
	if e != nil {
		writeError(w, e)
		return
	}
	if s.chat == nil {
		writeError(w, badRequest("messages", "the model %q has no chat_template in its tokenizer_config.json, so chat messages cannot be rendered; use /v1/completions with a prompt", s.opt.ModelName))
		return
	}
	// Cheap refusals before the expensive rendering: every message
	// renders to at least one token, and its content to at least
	// bytes ÷ maxTokenBytes tokens (checkTextBytes).
	if len(msgs) > s.opt.MaxModelLen {
		e := badRequest("messages", `"messages" holds %d messages; this model's maximum context length is %d tokens, so they cannot fit`, len(msgs), s.opt.MaxModelLen)
		e.Code = "context_length_exceeded"
		writeError(w, e)
		return
	}
	var content int
	for _, m := range msgs {
		content += len(strings.TrimSpace(m.Content)) // templates may strip content
	}
	if e := s.checkTextBytes(content, "messages"); e != nil {
		writeError(w, e)
		return
	}
	if !s.acquirePrep(r.Context()) {
		info.status = statusClientClosed
		return
	}
	prompt, err := s.chat.render(msgs)
	var ids []int
	if err == nil {
		ids = s.tok.Encode(prompt, false) // the template writes the special tokens itself
	}
	s.releasePrep()
	if err != nil {
		writeError(w, badRequest("messages", "the chat_template failed on these messages: %v", err))
		return
	}
	if len(ids) == 0 {
		writeError(w, badRequest("messages", "the chat template rendered the messages to no tokens"))
		return
	}
	if s.opt.LogPrompts {
		info.prompt = prompt
	}
	maxTok, e := s.budget(p, len(ids), "messages", 0)
	if e != nil {
		writeError(w, e)
		return
	}
	req := p.request(s.newID("chatcmpl-"), ids, maxTok, top)
	info.id = req.ID
	base := chatResponse{ID: req.ID, Object: "chat.completion", Created: s.now().Unix(), Model: s.opt.ModelName}
	logprobs := func(toks []tokOut) *chatLogprobs {
		if top < 0 || toks == nil { // nil: a chunk without tokens (role, finish)
			return nil
		}
		lp := &chatLogprobs{Content: []chatTokenLogprob{}}
		for _, t := range toks {
			c := chatTokenLogprob{Token: t.Text, Logprob: t.Logprob, Bytes: byteInts(t.Text), TopLogprobs: []chatTopLogprobs{}}
			for _, a := range t.Top {
				txt := s.altText(t.Prev, a.ID)
				c.TopLogprobs = append(c.TopLogprobs, chatTopLogprobs{Token: txt, Logprob: a.Logprob, Bytes: byteInts(txt)})
			}
			lp.Content = append(lp.Content, c)
		}
		return lp
	}
	if !p.stream {
		text, all, res, err := s.generateAll(r.Context(), info, req, p.stop)
		if err != nil {
			s.generateFailed(w, info, err)
			return
		}
		if all == nil {
			all = []tokOut{}
		}
		content := string(text)
		resp := base
		resp.Choices = []chatChoice{{Message: &chatOut{Role: "assistant", Content: &content}, Logprobs: logprobs(all), FinishReason: &res.Finish}}
		resp.Usage = newUsage(res)
		writeJSON(w, http.StatusOK, resp)
		return
	}
	base.Object = "chat.completion.chunk"
	sse := newSSE(w)
	chunk := func(d *chatOut, toks []tokOut, finish *string) any {
		c := base
		c.Choices = []chatChoice{{Delta: d, Logprobs: logprobs(toks), FinishReason: finish}}
		return c
	}
	first := func() error {
		if sse.started {
			return nil
		}
		empty := ""
		return sse.send(chunk(&chatOut{Role: "assistant", Content: &empty}, nil, nil))
	}
	res, err := s.generate(r.Context(), info, req, p.stop, func(t string, toks []tokOut) error {
		if err := first(); err != nil {
			return err
		}
		if t == "" && len(toks) == 0 {
			return nil
		}
		if toks == nil {
			toks = []tokOut{}
		}
		return sse.send(chunk(&chatOut{Content: &t}, toks, nil))
	})
	if !sse.started && err != nil {
		s.generateFailed(w, info, err)
		return
	}
	if err != nil {
		sse.fail(s, info, err)
		return
	}
	first()
	sse.send(chunk(&chatOut{}, nil, &res.Finish))
	if p.includeUsage {
		c := base
		c.Choices = []chatChoice{}
		c.Usage = newUsage(res)
		sse.send(c)
	}
	sse.done()
}
