exports.greet = () => "hello from the js probe";
