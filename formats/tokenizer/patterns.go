package tokenizer

// regexSplitter returns the finder for a split regular expression.
func regexSplitter(pat string) (finder, error) {
	re, err := compileRegex(pat)
	if err != nil {
		return nil, err
	}
	return regexFinder{re}, nil
}
