package openai

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// Usage counts a request's tokens.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// ChatMessage is an answer's message (or a chunk's delta).
type ChatMessage struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

// Choice is one choice of a completion or chat completion, whole or as a
// chunk. TokenIDs is an extension (as vLLM's return_token_ids): the ids of
// Text or of the message's content.
type Choice struct {
	Index        int          `json:"index"`
	Text         *string      `json:"text,omitempty"`    // completions
	Message      *ChatMessage `json:"message,omitempty"` // chat, whole
	Delta        *ChatMessage `json:"delta,omitempty"`   // chat, chunk
	TokenIDs     []int        `json:"token_ids"`
	FinishReason *string      `json:"finish_reason"`
}

// Completion is an answer: object "text_completion", "chat.completion" or
// "chat.completion.chunk". KVTransferParams is set by a prefill server in
// vLLM's flow; KVBridge is the server's own report (an extension).
type Completion struct {
	ID               string            `json:"id"`
	Object           string            `json:"object"`
	Created          int64             `json:"created"`
	Model            string            `json:"model"`
	Choices          []Choice          `json:"choices"`
	Usage            *Usage            `json:"usage,omitempty"`
	KVTransferParams *KVTransferParams `json:"kv_transfer_params,omitempty"`
	KVBridge         json.RawMessage   `json:"kvbridge,omitempty"`
}

// Tokens is the token ids of a whole answer's (or a chunk's) first choice.
func (c *Completion) Tokens() []int {
	if len(c.Choices) == 0 {
		return nil
	}
	return c.Choices[0].TokenIDs
}

// WriteError answers an OpenAI error object with its status.
func WriteError(w http.ResponseWriter, e *Error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	json.NewEncoder(w).Encode(e)
}

func encode(v any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
	return b.Bytes()
}

// Writer writes one request's answer as it is produced: SSE chunks for a
// streaming request (headers go with the first token, so a failure before
// it still gets its status), or one JSON object at the end.
type Writer struct {
	w       http.ResponseWriter
	req     *Request
	id      string
	model   string
	created int64
	tokens  []int
	started bool
	ended   bool
	err     error // the client's connection failed
}

// NewWriter starts an answer.
func NewWriter(w http.ResponseWriter, req *Request, id, model string) *Writer {
	return &Writer{w: w, req: req, id: id, model: model, created: time.Now().Unix()}
}

func (wr *Writer) object(chunk bool) string {
	switch {
	case !wr.req.Chat:
		return "text_completion"
	case chunk:
		return "chat.completion.chunk"
	}
	return "chat.completion"
}

func (wr *Writer) sse(v any) error {
	if wr.err != nil {
		return wr.err
	}
	if _, err := io.WriteString(wr.w, "data: "); err != nil {
		wr.err = err
		return err
	}
	b := encode(v)
	b = append(b[:len(b)-1], '\n', '\n')
	if _, err := wr.w.Write(b); err != nil {
		wr.err = err
		return err
	}
	if fl, ok := wr.w.(http.Flusher); ok {
		fl.Flush()
	}
	return nil
}

func (wr *Writer) start() error {
	if wr.started {
		return wr.err
	}
	wr.started = true
	wr.w.Header().Set("Content-Type", "text/event-stream")
	wr.w.Header().Set("Cache-Control", "no-cache")
	wr.w.WriteHeader(http.StatusOK)
	if wr.req.Chat {
		empty := ""
		return wr.sse(Completion{ID: wr.id, Object: wr.object(true), Created: wr.created, Model: wr.model,
			Choices: []Choice{{Delta: &ChatMessage{Role: "assistant", Content: &empty}, TokenIDs: []int{}}}})
	}
	return nil
}

// Token adds a generated token (streamed at once); an error means the
// client is gone.
func (wr *Writer) Token(id int) error {
	wr.tokens = append(wr.tokens, id)
	if !wr.req.Stream {
		return nil
	}
	if err := wr.start(); err != nil {
		return err
	}
	text := Detok(id)
	c := Completion{ID: wr.id, Object: wr.object(true), Created: wr.created, Model: wr.model}
	if wr.req.Chat {
		c.Choices = []Choice{{Delta: &ChatMessage{Content: &text}, TokenIDs: []int{id}}}
	} else {
		c.Choices = []Choice{{Text: &text, TokenIDs: []int{id}}}
	}
	return wr.sse(c)
}

// Started says whether the answer's status is out (a streamed token went).
func (wr *Writer) Started() bool { return wr.started }

// Generated is the tokens so far.
func (wr *Writer) Generated() []int { return wr.tokens }

// Finish ends a successful answer: finish reason "length" (the example
// has no end-of-sequence token), usage, and the extension fields.
func (wr *Writer) Finish(kv *KVTransferParams, ext any) error {
	if wr.ended {
		return nil
	}
	wr.ended = true
	finish := "length"
	usage := &Usage{PromptTokens: len(wr.req.Prompt), CompletionTokens: len(wr.tokens), TotalTokens: len(wr.req.Prompt) + len(wr.tokens)}
	var raw json.RawMessage
	if ext != nil {
		raw = encode(ext)
		raw = raw[:len(raw)-1]
	}
	c := Completion{ID: wr.id, Object: wr.object(wr.req.Stream), Created: wr.created, Model: wr.model, KVTransferParams: kv, KVBridge: raw}
	if !wr.req.Stream {
		text := DetokAll(wr.tokens)
		ids := append([]int{}, wr.tokens...)
		if wr.req.Chat {
			c.Choices = []Choice{{Message: &ChatMessage{Role: "assistant", Content: &text}, TokenIDs: ids, FinishReason: &finish}}
		} else {
			c.Choices = []Choice{{Text: &text, TokenIDs: ids, FinishReason: &finish}}
		}
		c.Usage = usage
		wr.started = true
		wr.w.Header().Set("Content-Type", "application/json")
		wr.w.WriteHeader(http.StatusOK)
		_, err := wr.w.Write(encode(c))
		return err
	}
	if err := wr.start(); err != nil {
		return err
	}
	empty := ""
	if wr.req.Chat {
		c.Choices = []Choice{{Delta: &ChatMessage{}, TokenIDs: []int{}, FinishReason: &finish}}
	} else {
		c.Choices = []Choice{{Text: &empty, TokenIDs: []int{}, FinishReason: &finish}}
	}
	if err := wr.sse(c); err != nil {
		return err
	}
	if wr.req.IncludeUsage {
		if err := wr.sse(Completion{ID: wr.id, Object: wr.object(true), Created: wr.created, Model: wr.model, Choices: []Choice{}, Usage: usage}); err != nil {
			return err
		}
	}
	_, err := io.WriteString(wr.w, "data: [DONE]\n\n")
	return err
}

// Fail ends the answer with an error: its status and OpenAI error object
// before anything was streamed, else an error event and [DONE].
func (wr *Writer) Fail(e *Error) {
	if wr.ended {
		return
	}
	wr.ended = true
	if !wr.started {
		wr.started = true
		WriteError(wr.w, e)
		return
	}
	if wr.sse(e) == nil {
		io.WriteString(wr.w, "data: [DONE]\n\n")
	}
}

// ErrStreamEnded: a stream that ended without [DONE] or its final chunk.
var ErrStreamEnded = errors.New("openai: the stream ended without its final chunk")

// Answer is what ReadAnswer read: the tokens, and the last object that
// carried a finish reason (the whole answer, or the final chunk) with the
// usage wherever it came.
type Answer struct {
	Tokens []int
	Final  *Completion
	// Raw is Final as it came (its kv_transfer_params are copied from
	// here, verbatim).
	Raw   json.RawMessage
	Usage *Usage
}

// ReadAnswer reads a server's answer to a completions or chat request:
// one JSON object, or SSE chunks up to "data: [DONE]"; onToken (nil: none)
// gets each token as it arrives. A non-2xx status, or an error event in
// the stream, is returned as an *Error.
func ReadAnswer(resp *http.Response, onToken func(int) error) (*Answer, error) {
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		e := &Error{Status: resp.StatusCode}
		if json.Unmarshal(data, e) != nil || e.Body.Message == "" {
			e.Body.Message = string(bytes.TrimSpace(data))
			e.Body.Type = "server_error"
		}
		return nil, e
	}
	a := &Answer{}
	add := func(c *Completion, raw []byte) error {
		for _, t := range c.Tokens() {
			a.Tokens = append(a.Tokens, t)
			if onToken != nil {
				if err := onToken(t); err != nil {
					return err
				}
			}
		}
		if len(c.Choices) > 0 && c.Choices[0].FinishReason != nil {
			a.Final, a.Raw = c, append(json.RawMessage(nil), raw...)
		}
		if c.Usage != nil {
			a.Usage = c.Usage
		}
		return nil
	}
	if !bytes.HasPrefix([]byte(resp.Header.Get("Content-Type")), []byte("text/event-stream")) {
		data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
		if err != nil {
			return nil, err
		}
		var c Completion
		if err := json.Unmarshal(data, &c); err != nil {
			return nil, fmt.Errorf("openai: answer %.80q: %w", data, err)
		}
		if err := add(&c, bytes.TrimSpace(data)); err != nil {
			return a, err
		}
		if a.Final == nil {
			return a, errors.New("openai: an answer without a finish reason")
		}
		return a, nil
	}
	rd := bufio.NewReaderSize(resp.Body, 64<<10)
	for {
		line, err := rd.ReadBytes('\n')
		if len(line) > 1<<20 {
			return a, errors.New("openai: an SSE line over 1 MiB")
		}
		if data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data: ")); ok {
			if string(data) == "[DONE]" {
				if a.Final == nil {
					return a, ErrStreamEnded
				}
				return a, nil
			}
			var probe struct {
				Error json.RawMessage `json:"error"`
			}
			if json.Unmarshal(data, &probe) == nil && len(probe.Error) > 0 {
				e := &Error{Status: http.StatusBadGateway}
				json.Unmarshal(data, e)
				return a, e
			}
			var c Completion
			if err := json.Unmarshal(data, &c); err != nil {
				return a, fmt.Errorf("openai: SSE event %.80q: %w", data, err)
			}
			if err := add(&c, data); err != nil {
				return a, err
			}
		}
		if err != nil {
			if err == io.EOF {
				return a, ErrStreamEnded
			}
			return a, err
		}
	}
}
