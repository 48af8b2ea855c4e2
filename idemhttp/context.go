package idemhttp

import "context"

// mergeValues is a context with the deadline and cancellation of done and
// the values of values: the handler ends when its client leaves (done is
// the request's context) and sees what the call added (values carries the
// call's key and the observer's span, on top of the request's own values).
func mergeValues(done, values context.Context) context.Context {
	return valuesFrom{Context: done, values: values}
}

type valuesFrom struct {
	context.Context
	values context.Context
}

func (c valuesFrom) Value(key any) any {
	// The context package finds a context's cancellation (context.Cause,
	// and the parent of a derived context) through Value with a key of its
	// own, an *int: answer it from the context whose cancellation this is.
	if _, ok := key.(*int); ok {
		return c.Context.Value(key)
	}
	return c.values.Value(key)
}
